"""Temperature 0 is greedy decoding on both engines (evaluation): the argmax token at every step,
the same output whatever the seed, top-p/top-k ignored; log-probs at T = 1."""
from __future__ import annotations

import pytest
import torch

from rllib_spear.env_runners.engines.base import SamplingConfig


def _argmax_continuation(model, prompt, steps):
    """The greedy continuation by hand: one full forward per step, argmax of the last logits."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt):]


def test_sampling_config_accepts_zero_and_refuses_negative():
    assert SamplingConfig(temperature=0.0).greedy
    SamplingConfig(temperature=0.0).validate()
    with pytest.raises(ValueError, match="temperature must be > 0, or 0 for greedy"):
        SamplingConfig(temperature=-0.5).validate()


def test_hf_greedy_is_the_argmax_for_any_seed(hf_engine, chat_prompts):
    outs = hf_engine.generate(chat_prompts, SamplingConfig(temperature=0.0, max_new_tokens=6, seed=1))
    again = hf_engine.generate(chat_prompts, SamplingConfig(temperature=0.0, max_new_tokens=6, seed=999,
                                                            top_p=0.5, top_k=3))
    assert [o.token_ids for o in outs] == [o.token_ids for o in again]
    for p, o in zip(chat_prompts[:3], outs[:3]):
        ref = _argmax_continuation(hf_engine.model, p, len(o.token_ids))
        assert o.token_ids == ref
        rescored = hf_engine.score([list(p) + o.token_ids], temperature=1.0)[0][len(p):]
        assert max(abs(a - b) for a, b in zip(o.logprobs, rescored)) < 1e-4  # log-probs at T = 1
    group = hf_engine.generate([chat_prompts[0]] * 3, SamplingConfig(temperature=0.0, max_new_tokens=6, seed=3))
    assert len({tuple(o.token_ids) for o in group}) == 1, "a greedy group is n copies of one answer"


@pytest.mark.vllm
def test_vllm_greedy_is_deterministic_and_matches_hf(vllm_engine, hf_engine, chat_prompts):
    sc = SamplingConfig(temperature=0.0, max_new_tokens=8, seed=1)
    outs = vllm_engine.generate(chat_prompts, sc)
    again = vllm_engine.generate(chat_prompts, SamplingConfig(temperature=0.0, max_new_tokens=8, seed=77, top_p=0.5))
    assert [o.token_ids for o in outs] == [o.token_ids for o in again]
    group = vllm_engine.generate([chat_prompts[0]] * 3, sc)
    assert len({tuple(o.token_ids) for o in group}) == 1
    hf = hf_engine.generate(chat_prompts, sc)
    assert [o.token_ids for o in outs] == [o.token_ids for o in hf], "fp32 argmax: the same tokens"
