"""Slow: the embedded default policy builds from the envs' scripted demonstrations and has
learned the answer format (about a minute on 2 cores, cached afterwards)."""
from __future__ import annotations

import pytest

from rllib_spear.env_runners.engines.base import SamplingConfig


@pytest.mark.slow
def test_default_policy_learns_the_format(tmp_path_factory):
    envs = pytest.importorskip("rllib_spear.envs")
    if not hasattr(envs, "scripted_demonstrations"):
        pytest.skip("rllib_spear.envs.scripted_demonstrations is not available")
    from rllib_spear.env_runners.engines.hf_engine import HFEngine
    from rllib_spear.models.sft import default_policy_path

    root = tmp_path_factory.mktemp("default_policy")
    path = default_policy_path(root)
    assert default_policy_path(root) == path  # cached
    eng = HFEngine(path)
    tok = eng.tokenizer
    assert 0.5e6 < sum(p.numel() for p in eng.model.parameters()) < 5e6
    env = envs.make_env("search_qa")
    tasks = envs.load_tasks("search_qa", split="test")[:16]
    prompts = [tok(tok.apply_chat_template(env.reset(t), add_generation_prompt=True, tokenize=False),
                   add_special_tokens=False)["input_ids"] for t in tasks]
    outs = eng.generate(prompts, SamplingConfig(max_new_tokens=64, seed=0))
    texts = [tok.decode(o.token_ids) for o in outs]
    closed = [o.finish_reason == "stop" and o.token_ids[-1] == tok.eos_token_id for o in outs]
    tagged = ["</answer>" in t or "</search>" in t for t in texts]
    assert sum(closed) >= 12 and sum(tagged) >= 12, texts
