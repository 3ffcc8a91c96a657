"""HFEngine's shared-prompt prefill, preallocated KV cache and prepared decode mask: faster, and the
same samples and log-probs as the per-row prefill into a growing ``DynamicCache`` with the model's
own mask at every step."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers.cache_utils import Cache, DynamicLayer, DynamicSlidingWindowLayer

from rllib_spear.env_runners.engines.base import SamplingConfig
from rllib_spear.env_runners.engines.hf_engine import HFEngine, PreallocatedLayer, group_identical


@pytest.fixture(scope="module")
def group_prompts(chat_prompts):
    """Three distinct prompts of different lengths, four samples each, interleaved (the batching
    scheduler orders rows by seed, so a group's rows need not be adjacent)."""
    distinct = [chat_prompts[0], chat_prompts[1], chat_prompts[3]]
    assert len({len(p) for p in distinct}) > 1
    return [distinct[i % 3] for i in range(12)]


@pytest.fixture(scope="module")
def engines(hf_engine):
    """The same model and tokenizer behind each combination of the two switches."""
    def make(shared: bool, prealloc: bool) -> HFEngine:
        return HFEngine(model=hf_engine.model, tokenizer=hf_engine.tokenizer, shared_prefill=shared,
                        preallocate_kv=prealloc)

    return {(s, p): make(s, p) for s in (False, True) for p in (False, True)}


def _full_forward_logprobs(engine: HFEngine, prompts, outs, temperature: float) -> list[list[float]]:
    """log softmax(logits / T) of every sampled token from a full forward (no cache, no padding)
    over each prompt + completion."""
    scored = engine.score([list(p) + o.token_ids for p, o in zip(prompts, outs)], temperature=temperature)
    return [s[len(p):] for p, s in zip(prompts, scored)]


def _prefill_batch_sizes(engine: HFEngine, prompts, sampling: SamplingConfig) -> list[int]:
    """The batch size of every multi-token forward (a prefill) during one ``generate``."""
    sizes: list[int] = []

    def record(_module, _args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[1] > 1:
            sizes.append(ids.shape[0])

    handle = engine.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        engine.generate(prompts, sampling)
    finally:
        handle.remove()
    return sizes


def test_group_identical_finds_repeated_prompts():
    first, group = group_identical([[1, 2], [3], [1, 2], [4, 5, 6], [3], [1, 2]])
    assert first == [0, 1, 3]
    assert group == [0, 1, 0, 2, 1, 0]
    assert group_identical([[1], [2]]) == ([0, 1], [0, 1])
    # a prefix is not the same prompt
    assert group_identical([[1, 2], [1, 2, 3]])[0] == [0, 1]


def test_identical_prompts_are_prefilled_once(engines, group_prompts):
    sc = SamplingConfig(max_new_tokens=3, seed=0)
    assert _prefill_batch_sizes(engines[(True, True)], group_prompts, sc) == [3]
    assert _prefill_batch_sizes(engines[(False, True)], group_prompts, sc) == [12]


@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 1.0, -1), (0.7, 1.0, -1), (1.3, 0.9, 20)])
def test_shared_prefill_logprobs_match_a_full_forward(engines, group_prompts, temperature, top_p, top_k):
    sc = SamplingConfig(max_new_tokens=16, seed=5, temperature=temperature, top_p=top_p, top_k=top_k)
    outs = engines[(True, True)].generate(group_prompts, sc)
    assert all(len(o.token_ids) == len(o.logprobs) > 0 for o in outs)
    # the samples of a group differ: the copies of the prefilled row are independent rows
    assert len({tuple(o.token_ids) for o in outs[0::3]}) > 1
    rescored = _full_forward_logprobs(engines[(True, True)], group_prompts, outs, temperature)
    for o, r in zip(outs, rescored):
        assert max(abs(x - y) for x, y in zip(o.logprobs, r)) < 1e-5


def test_shared_prefill_gives_the_per_row_prefill_samples(engines, group_prompts):
    sc = SamplingConfig(max_new_tokens=16, seed=9, temperature=0.9)
    shared = engines[(True, False)].generate(group_prompts, sc)
    per_row = engines[(False, False)].generate(group_prompts, sc)
    assert [o.token_ids for o in shared] == [o.token_ids for o in per_row]
    assert [o.finish_reason for o in shared] == [o.finish_reason for o in per_row]
    for a, b in zip(shared, per_row):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-6


@pytest.mark.parametrize("case", ["plain", "top_p_top_k", "stops_and_caps", "greedy"])
def test_preallocated_cache_reproduces_the_growing_cache(engines, chat_prompts, group_prompts, case):
    # per-row prefill on both sides: only the cache differs, and the outputs are bitwise equal
    prompts, caps = group_prompts, None
    sc = SamplingConfig(max_new_tokens=24, seed=3)
    if case == "top_p_top_k":
        sc = SamplingConfig(max_new_tokens=24, seed=4, temperature=1.2, top_p=0.8, top_k=30)
    elif case == "stops_and_caps":  # rows leave the batch at different steps
        prompts, caps = chat_prompts, [24, 3, 0, 17, 9, 24]
        sc = SamplingConfig(max_new_tokens=24, seed=6, stop=["e", "o "])
    elif case == "greedy":
        sc = SamplingConfig(max_new_tokens=24, seed=0, temperature=0.0)
    new = engines[(False, True)].generate(prompts, sc, caps)
    old = engines[(False, False)].generate(prompts, sc, caps)
    assert [o.token_ids for o in new] == [o.token_ids for o in old]
    assert [o.logprobs for o in new] == [o.logprobs for o in old]
    assert [o.finish_reason for o in new] == [o.finish_reason for o in old]
    if case == "stops_and_caps":
        assert new[2].token_ids == [] and len({len(o.token_ids) for o in new}) > 2


def test_preallocated_layer_writes_in_place_grows_and_selects_rows():
    keys, values = torch.randn(3, 2, 4, 5), torch.randn(3, 2, 4, 5)
    layer = PreallocatedLayer(keys, values, capacity=6)
    buf = layer._k
    k1, v1 = torch.randn(3, 2, 1, 5), torch.randn(3, 2, 1, 5)
    k, v = layer.update(k1, v1)
    assert layer._k is buf and layer.get_seq_length() == 5  # written into the buffer, no new tensor
    assert torch.equal(k, torch.cat([keys, k1], dim=-2)) and torch.equal(v, torch.cat([values, v1], dim=-2))
    k2 = torch.randn(3, 2, 3, 5)
    k, _ = layer.update(k2, k2)  # past the capacity: the buffers grow
    assert layer.get_seq_length() == 8 and layer._k.shape[-2] >= 8
    assert torch.equal(k, torch.cat([keys, k1, k2], dim=-2))
    layer.batch_select_indices(torch.tensor([2, 0]))
    assert torch.equal(layer.keys, torch.cat([keys, k1, k2], dim=-2)[[2, 0]])
    k, _ = layer.update(k1[:2], v1[:2])
    assert k.shape == (2, 2, 9, 5)


def test_other_cache_layers_keep_their_growth(hf_engine):
    # a sliding-window layer has its own rule: the engine only repeats the shared rows
    cache = Cache(layers=[DynamicLayer(), DynamicSlidingWindowLayer(sliding_window=4)])
    for i in range(2):
        cache.update(torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4), i)
    out = hf_engine._decode_cache(cache, torch.tensor([0, 0, 1]), capacity=10)
    assert [type(x) for x in out.layers] == [DynamicLayer, DynamicSlidingWindowLayer]
    assert out.layers[0].keys.shape[0] == 3
    plain = Cache(layers=[DynamicLayer()])
    plain.update(torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4), 0)
    out = hf_engine._decode_cache(plain, None, capacity=10)
    assert type(out.layers[0]) is PreallocatedLayer and out.get_seq_length() == 3


@pytest.mark.parametrize("case", ["padded", "stops_and_caps", "no_padding", "greedy"])
def test_prepared_decode_mask_reproduces_the_models_mask(hf_engine, chat_prompts, group_prompts, monkeypatch, case):
    # the 4D padding mask built once per batch gives bitwise the outputs of the model building
    # its mask from the 2D one at every step (rows leaving included; no padding: no mask)
    prompts, caps = group_prompts, None
    sc = SamplingConfig(max_new_tokens=20, seed=12, temperature=1.1, top_p=0.95)
    if case == "stops_and_caps":
        prompts, caps = chat_prompts, [20, 4, 0, 13, 7, 20]
        sc = SamplingConfig(max_new_tokens=20, seed=13, stop=["e", "o "])
    elif case == "no_padding":
        prompts = [chat_prompts[1]] * 5
    elif case == "greedy":
        sc = SamplingConfig(max_new_tokens=20, temperature=0.0)
    masks: list = []
    real = HFEngine._prepared_mask

    def spy(self, cache, attn):
        masks.append(real(self, cache, attn))
        return masks[-1]

    monkeypatch.setattr(HFEngine, "_prepared_mask", spy)
    prepared = hf_engine.generate(prompts, sc, caps)
    assert masks and all(m is not None for m in masks)
    assert (masks[0].numel() == 0) == (case == "no_padding")
    monkeypatch.setattr(HFEngine, "_prepared_mask", lambda self, cache, attn: None)
    per_step = hf_engine.generate(prompts, sc, caps)
    assert [o.token_ids for o in prepared] == [o.token_ids for o in per_step]
    assert [o.logprobs for o in prepared] == [o.logprobs for o in per_step]
    assert [o.finish_reason for o in prepared] == [o.finish_reason for o in per_step]


def test_no_prepared_mask_for_other_attention_or_layers(hf_engine):
    attn = torch.tensor([[0, 1, 1], [1, 1, 1]])
    full = Cache(layers=[DynamicLayer()])
    assert torch.equal(hf_engine._prepared_mask(full, attn), attn.bool()[:, None, None, :])
    # a sliding-window layer needs the model's own mask
    assert hf_engine._prepared_mask(Cache(layers=[DynamicLayer(), DynamicSlidingWindowLayer(sliding_window=4)]),
                                    attn) is None
    # an eager attention adds a float mask: the model's own
    eager = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(_attn_implementation="eager")))
    assert HFEngine._prepared_mask(eager, full, attn) is None
