"""HFEngine: seeded sampling, log-probs that the trainer reproduces, stops, caps, padding."""
from __future__ import annotations

import pytest
import torch

from rllib_spear.env_runners.engines.base import GenerationOutput, SamplingConfig
from rllib_spear.models.logprobs import token_logprobs


def _rescore(engine, prompts, outs, temperature=1.0):
    """Trainer-side log-probs of every sampled token: one left-padded batch through token_logprobs."""
    seqs = [list(p) + o.token_ids for p, o in zip(prompts, outs)]
    L = max(map(len, seqs))
    ids = torch.zeros((len(seqs), L), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, L - len(s):] = torch.tensor(s)
        mask[i, L - len(s):] = 1
    with torch.no_grad():
        lp = token_logprobs(engine.model, ids, mask, temperature=temperature, chunk_size=16)
    return [lp[i, L - len(o.token_ids):].tolist() if o.token_ids else [] for i, o in enumerate(outs)]


def test_seeded_determinism(hf_engine, chat_prompts):
    sc = SamplingConfig(max_new_tokens=12, seed=123)
    a = hf_engine.generate(chat_prompts, sc)
    b = hf_engine.generate(chat_prompts, sc)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.logprobs for o in a] == [o.logprobs for o in b]
    c = hf_engine.generate(chat_prompts, SamplingConfig(max_new_tokens=12, seed=124))
    assert [o.token_ids for o in a] != [o.token_ids for o in c]
    # repeated prompts in one batch (a GRPO group) get different samples
    group = hf_engine.generate([chat_prompts[0]] * 4, sc)
    assert len({tuple(o.token_ids) for o in group}) > 1


@pytest.mark.parametrize(
    "temperature,top_p,top_k", [(1.0, 1.0, -1), (0.7, 1.0, -1), (1.3, 0.9, 20)]
)
def test_logprobs_match_rescoring(hf_engine, chat_prompts, temperature, top_p, top_k):
    sc = SamplingConfig(max_new_tokens=16, seed=7, temperature=temperature, top_p=top_p, top_k=top_k)
    outs = hf_engine.generate(chat_prompts, sc)
    assert all(isinstance(o, GenerationOutput) and len(o.token_ids) == len(o.logprobs) > 0 for o in outs)
    rescored = _rescore(hf_engine, chat_prompts, outs, temperature)
    for o, r in zip(outs, rescored):
        assert max(abs(x - y) for x, y in zip(o.logprobs, r)) < 1e-4
        assert all(lp <= 0 for lp in o.logprobs)


def test_top_k_restricts_samples(hf_engine, chat_prompts):
    outs = hf_engine.generate(chat_prompts, SamplingConfig(max_new_tokens=10, seed=3, top_k=1))
    # top_k = 1 is greedy: the sampled token is the argmax of the full distribution
    for p, o in zip(chat_prompts, outs):
        seq = torch.tensor([list(p) + o.token_ids])
        with torch.no_grad():
            logits = hf_engine.model(input_ids=seq).logits[0]
        greedy = logits[len(p) - 1 : len(seq[0]) - 1].argmax(-1).tolist()
        assert greedy == o.token_ids


def test_stop_string_ends_generation_and_is_kept(hf_engine, chat_prompts):
    tok = hf_engine.tokenizer
    prompt = chat_prompts[0]
    free = hf_engine.generate([prompt], SamplingConfig(max_new_tokens=30, seed=5))[0]
    assert len(free.token_ids) >= 8, "need a long enough free run"
    text = tok.decode(free.token_ids[:8])
    stop = text[-3:] if len(text.strip()) >= 3 else text
    # where the stop string first completes in the free run
    j = next(j for j in range(1, len(free.token_ids) + 1) if stop in tok.decode(free.token_ids[:j]))
    out = hf_engine.generate([prompt], SamplingConfig(max_new_tokens=30, seed=5, stop=[stop]))[0]
    assert out.token_ids == free.token_ids[:j]
    assert out.finish_reason == "stop"
    assert tok.decode(out.token_ids).find(stop) >= 0
    assert out.logprobs == free.logprobs[:j]


def test_stop_strings_in_a_batch(hf_engine, chat_prompts):
    tok = hf_engine.tokenizer
    stops = ["e", "a"]
    outs = hf_engine.generate(chat_prompts, SamplingConfig(max_new_tokens=40, seed=9, stop=stops))
    assert any(o.finish_reason == "stop" for o in outs)
    for o in outs:
        full, prev = tok.decode(o.token_ids), tok.decode(o.token_ids[:-1])
        if o.finish_reason == "stop" and o.token_ids[-1] not in hf_engine.eos_token_ids:
            assert any(s in full for s in stops) and not any(s in prev for s in stops)
        elif o.finish_reason == "length":
            assert not any(s in full for s in stops) and len(o.token_ids) == 40


def test_stop_token_ids_and_eos(hf_engine, chat_prompts):
    prompt = chat_prompts[1]
    free = hf_engine.generate([prompt], SamplingConfig(max_new_tokens=20, seed=2))[0]
    stop_id = free.token_ids[5]
    j = free.token_ids.index(stop_id) + 1
    out = hf_engine.generate([prompt], SamplingConfig(max_new_tokens=20, seed=2, stop_token_ids=[stop_id]))[0]
    assert out.token_ids == free.token_ids[:j] and out.token_ids[-1] == stop_id
    assert out.finish_reason == "stop"
    # eos (<|im_end|>) is always a stop and is kept in the output
    eos = hf_engine.tokenizer.eos_token_id
    assert eos in hf_engine.eos_token_ids
    saved = list(hf_engine.eos_token_ids)
    try:
        hf_engine.eos_token_ids = [stop_id]  # pretend that token is eos
        out2 = hf_engine.generate([prompt], SamplingConfig(max_new_tokens=20, seed=2))[0]
    finally:
        hf_engine.eos_token_ids = saved
    assert out2.token_ids == out.token_ids and out2.finish_reason == "stop"


def test_per_prompt_max_new_tokens(hf_engine, chat_prompts):
    caps = [1, 3, 7, 0, 12, 5]
    sc = SamplingConfig(max_new_tokens=10, seed=4)
    outs = hf_engine.generate(chat_prompts, sc, max_new_tokens=caps)
    for cap, o in zip(caps, outs):
        eff = min(cap, 10)
        assert len(o.token_ids) <= eff
        if o.finish_reason == "length":
            assert len(o.token_ids) == eff
    assert outs[3].token_ids == [] and outs[3].finish_reason == "length"
    assert len(outs[4].token_ids) <= 10
    with pytest.raises(ValueError):
        hf_engine.generate(chat_prompts, sc, max_new_tokens=[1, 2])


def test_left_padding_does_not_change_logprobs(hf_engine, chat_prompts):
    # batch generation (left padded) vs each sequence scored alone, unpadded
    outs = hf_engine.generate(chat_prompts, SamplingConfig(max_new_tokens=12, seed=8))
    assert len({len(p) for p in chat_prompts}) > 1
    for p, o in zip(chat_prompts, outs):
        alone = hf_engine.score([list(p) + o.token_ids])[0][len(p):]
        assert max(abs(x - y) for x, y in zip(alone, o.logprobs)) < 1e-4
    # and a single-prompt generation scores its tokens like the batch does
    one = hf_engine.generate([chat_prompts[2]], SamplingConfig(max_new_tokens=12, seed=8))[0]
    alone = hf_engine.score([list(chat_prompts[2]) + one.token_ids])[0][len(chat_prompts[2]):]
    assert max(abs(x - y) for x, y in zip(alone, one.logprobs)) < 1e-4


def test_max_batch_size_chunks(tiny_path, chat_prompts):
    from rllib_spear.env_runners.engines.hf_engine import HFEngine

    eng = HFEngine(tiny_path, max_batch_size=2)
    outs = eng.generate(chat_prompts, SamplingConfig(max_new_tokens=6, seed=1))
    assert len(outs) == len(chat_prompts)
    for p, o in zip(chat_prompts, outs):
        alone = eng.score([list(p) + o.token_ids])[0][len(p):]
        assert max(abs(x - y) for x, y in zip(alone, o.logprobs)) < 1e-4


def test_update_weights_in_place(tiny_path, chat_prompts):
    from rllib_spear.env_runners.engines.hf_engine import HFEngine

    eng = HFEngine(tiny_path)
    seq = list(chat_prompts[0]) + [5, 6, 7, 8]
    before = eng.score([seq])[0]
    ptr = eng.model.model.embed_tokens.weight.data_ptr()
    torch.manual_seed(0)
    new = {k: (v.detach() + 0.05 * torch.randn_like(v)).to(torch.bfloat16) for k, v in eng.model.named_parameters()}
    eng.update_weights(new, version=2)
    assert eng.version == 2
    assert eng.model.model.embed_tokens.weight.data_ptr() == ptr  # in place
    assert eng.model.model.embed_tokens.weight.dtype == torch.float32
    after = eng.score([seq])[0]
    assert max(abs(a - b) for a, b in zip(before, after)) > 1e-2
    # the tied head follows the embedding
    assert torch.equal(eng.model.lm_head.weight, eng.model.model.embed_tokens.weight)
    with pytest.raises(KeyError):
        eng.update_weights({"no.such.weight": torch.zeros(1)}, version=3)
    with pytest.raises(ValueError):
        eng.update_weights({"model.norm.weight": torch.zeros(3)}, version=3)
