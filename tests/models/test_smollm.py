"""Slow smoke test: the packaged SmolLM2-135M-Instruct loads and generates with the HF engine."""
from __future__ import annotations

import pytest

from rllib_spear.env_runners.engines.base import SamplingConfig


@pytest.mark.slow
def test_smollm2_loads_and_generates(smollm2_folder):
    from rllib_spear.env_runners.engines.hf_engine import HFEngine

    eng = HFEngine(smollm2_folder)
    tok = eng.tokenizer
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    out = eng.generate([ids], SamplingConfig(max_new_tokens=8, top_k=1, seed=0))[0]
    text = tok.decode(out.token_ids)
    assert len(out.token_ids) == len(out.logprobs) > 0
    assert "Paris" in text, text
    assert abs(eng.score([ids + out.token_ids])[0][len(ids)] - out.logprobs[0]) < 1e-3
