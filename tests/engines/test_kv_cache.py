"""The HF engine's preallocated KV cache decodes exactly what transformers' DynamicCache decodes:
the same tokens and log-probs, greedy and seeded sampling, with rows leaving the batch early (per
prompt caps) and a capacity too small (the buffer grows)."""
from __future__ import annotations

import pytest
import torch

from rllib_spear.env_runners.engines.base import SamplingConfig
from rllib_spear.env_runners.engines.hf_engine import HFEngine
from rllib_spear.env_runners.engines.kv_cache import PreallocatedLayer, make_kv_cache, preallocated_cache


@pytest.fixture(scope="module")
def engines(hf_engine):
    dyn = HFEngine(model=hf_engine.model, tokenizer=hf_engine.tokenizer, kv_cache="dynamic")
    pre = HFEngine(model=hf_engine.model, tokenizer=hf_engine.tokenizer)
    assert pre.kv_cache == "preallocated"
    return dyn, pre


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_same_tokens_and_logprobs_as_dynamic(engines, chat_prompts, temperature):
    dyn, pre = engines
    cfg = SamplingConfig(temperature=temperature, max_new_tokens=24, seed=5)
    caps = [24, 3, 17, 24, 1, 9]  # rows leave at different steps
    a = dyn.generate(chat_prompts, cfg, caps)
    b = pre.generate(chat_prompts, cfg, caps)
    for x, y in zip(a, b):
        assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)


def test_layer_grows_past_its_capacity_and_selects_rows():
    layer = PreallocatedLayer(capacity=3)
    k = torch.arange(2 * 1 * 2 * 4, dtype=torch.float32).reshape(2, 1, 2, 4)
    keys, _ = layer.update(k, k + 100)
    assert keys.shape == (2, 1, 2, 4) and torch.equal(keys, k)
    for step in range(3):  # 2 + 3 positions > capacity 3: one doubling
        new = torch.full((2, 1, 1, 4), float(step))
        keys, values = layer.update(new, new)
    assert layer.get_seq_length() == 5 and keys.shape == (2, 1, 5, 4)
    assert torch.equal(keys[:, :, :2], k) and torch.equal(keys[:, :, 4], torch.full((2, 1, 4), 2.0))
    layer.batch_select_indices(torch.tensor([1]))
    assert layer.keys.shape == (1, 1, 5, 4) and torch.equal(layer.keys[0, :, :2], k[1])


def test_unknown_kind_names_the_choices(hf_engine):
    with pytest.raises(ValueError, match="preallocated"):
        HFEngine(model=hf_engine.model, tokenizer=hf_engine.tokenizer, kv_cache="paged")
    with pytest.raises(ValueError, match="dynamic"):
        make_kv_cache("paged", hf_engine.model, 8)
    assert all(isinstance(layer, PreallocatedLayer) for layer in preallocated_cache(hf_engine.model, 8).layers)
