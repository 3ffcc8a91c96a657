"""The embedded default policy: the shipped build matches the current recipe and data, it has
learned the format and it can read (a search answers the question far more often than a guess);
the build pipeline runs every stage on a reduced recipe."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rllib_spear.env_runners.engines.base import SamplingConfig


def test_shipped_build_matches_the_recipe(tmp_path):
    from rllib_spear.models.sft import SHIPPED_POLICIES, default_policy_key, default_policy_path

    key = default_policy_key()
    shipped = SHIPPED_POLICIES / f"default-policy-{key}"
    assert (shipped / "model.safetensors").exists(), (
        f"no shipped default policy for recipe key {key}: the recipe or the embedded data changed; "
        "rebuild it with `python -m rllib_spear.models.sft` and commit rllib_spear/assets")
    path = default_policy_path(tmp_path)
    assert Path(path).name == f"sft-shipped-{key}"
    assert (Path(path) / "model.safetensors").read_bytes() == (shipped / "model.safetensors").read_bytes()
    assert default_policy_path(tmp_path) == path  # cached


@pytest.mark.slow
def test_default_policy_learns_the_format_and_to_read(tmp_path_factory):
    envs = pytest.importorskip("rllib_spear.envs")
    from rllib_spear.env_runners.engines.hf_engine import HFEngine
    from rllib_spear.models.sft import default_policy_path

    path = default_policy_path(tmp_path_factory.mktemp("default_policy"))
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
    # Reading: given the result of the right search, the greedy continuation answers correctly
    # far more often than the ~5% a guess gets (held-out test questions, 1-hop).
    one_hop = [t for t in envs.load_tasks("search_qa", split="test") if t["data_source"].endswith("1hop")][:40]
    demos = envs.scripted_demonstrations("search_qa", one_hop, tool_use_rate=1.0, seed=0, think="evidence")
    right = 0
    for task, conv in zip(one_hop, demos):
        ids = tok(tok.apply_chat_template(conv[:4], add_generation_prompt=True, tokenize=False),
                  add_special_tokens=False)["input_ids"]
        out = eng.generate([ids], SamplingConfig(max_new_tokens=48, temperature=1e-4, seed=0))[0]
        right += f"<answer>{task['golden_answers'][0]}</answer>" in tok.decode(out.token_ids)
    assert right >= 12, right  # ~55% on train questions; a guess gets ~5%


@pytest.mark.slow
def test_build_pipeline_runs_every_stage(tmp_path):
    from rllib_spear.models.sft import DEFAULT_POLICY_RECIPE, default_policy_path

    recipe = dict(
        DEFAULT_POLICY_RECIPE, hidden=64, heads=1, demo_passes=1,
        copy_pretrain=dict(steps=5, seq_len=32, batch_size=4, lr=3e-3, seed=0),
        reading=dict(DEFAULT_POLICY_RECIPE["reading"], worlds=1, epochs=1, batch_size=64, max_len=256),
        sft=dict(epochs=1, lr=1e-3, seed=0, max_len=256, batch_size=64),
    )
    path = Path(default_policy_path(tmp_path, recipe=recipe))
    assert not path.name.startswith("sft-shipped")  # not the default recipe: built here
    sft = json.loads((path / "sft_meta.json").read_text())
    reading = json.loads((Path(sft["base"]) / "sft_meta.json").read_text())
    copy = json.loads((Path(reading["base"]) / "copy_meta.json").read_text())
    assert reading["train_on"] == "all" and copy["steps"] == 5
    assert Path(copy["base"]).name.startswith("default-base-")
    assert default_policy_path(tmp_path, recipe=recipe) == str(path)
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(path)
    assert m.config.hidden_size == 64 and torch.isfinite(next(m.parameters())).all()


def test_embedded_model_paths_resolve(monkeypatch):
    from rllib_spear.models import rl_module, sft

    calls = []
    monkeypatch.setattr(sft, "default_policy_path", lambda *a, **k: calls.append("default") or "/d")
    monkeypatch.setattr(sft, "task_policy_path", lambda task, *a, **k: calls.append(task) or f"/t/{task}")
    assert rl_module.resolve_model_path("embedded") == "/d"
    assert rl_module.resolve_model_path("embedded:default") == "/d"
    assert rl_module.resolve_model_path("embedded:search_qa") == "/d"
    assert rl_module.resolve_model_path("embedded:multi_answer_search") == "/t/multi_answer_search"
    assert rl_module.resolve_model_path("/models/qwen") == "/models/qwen"
    assert calls == ["default", "default", "default", "multi_answer_search"]
    # the env runner uses the very same function (one resolution for learners and runners)
    from rllib_spear.env_runners import llm_env_runner

    assert llm_env_runner.resolve_model_path is rl_module.resolve_model_path


def test_shipped_task_policies_match_their_recipes(tmp_path):
    from rllib_spear.models.sft import SHIPPED_POLICIES, SHIPPED_TASKS, task_policy_key, task_policy_path

    for task in SHIPPED_TASKS:
        key = task_policy_key(task, cache_dir=tmp_path)
        shipped = SHIPPED_POLICIES / f"task-policy-{task}-{key}"
        assert (shipped / "model.safetensors").exists(), (
            f"no shipped {task} cold start for key {key}: its recipe, the default policy or the data "
            "changed; rebuild with `python -m rllib_spear.models.sft` and commit rllib_spear/assets")
        path = task_policy_path(task, tmp_path)
        assert Path(path).name == f"sft-shipped-{task}-{key}"
        assert task_policy_path(task, tmp_path) == path  # cached


@pytest.mark.slow
def test_task_policy_searches_and_copies_on_multi_answer(tmp_path_factory):
    """The multi-answer cold start (a) lists what a search found far better than the search_qa
    policy, which never answers with a list, and (b) sampled at T=1 searches now and then, and an
    episode that searches scores more than one that guesses: the signal RL needs."""
    envs = pytest.importorskip("rllib_spear.envs")
    from rllib_spear.env_runners.engines.hf_engine import HFEngine
    from rllib_spear.models.sft import default_policy_path, task_policy_env_config, task_policy_path

    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import policy_skills  # the measurement `benchmarks/policy_skills.py --task multi_answer_search` prints

    cache = tmp_path_factory.mktemp("task_policy")
    path = task_policy_path("multi_answer_search", cache)
    cfg = task_policy_env_config("multi_answer_search")
    assert cfg["parser"] == "search_r1"
    tasks = envs.load_tasks("multi_answer_search", split="test")[:40]
    eng = HFEngine(path)
    listed, demos = policy_skills.listing_f1_after_searches(eng, tasks, cfg)
    assert listed >= 0.06 and demos > 0.6, (listed, demos)  # measured 0.10 (demonstrations: 0.70)
    default, _ = policy_skills.listing_f1_after_searches(HFEngine(default_policy_path(cache)), tasks, cfg)
    assert default < listed / 2, default
    r = policy_skills.free_rollouts(eng, "multi_answer_search", tasks, 4, cfg, "f1", max_new_tokens=64,
                                    max_model_len=1024, max_response_tokens=512)
    assert 0.05 <= r["tool_call_rate"] <= 0.5, r
    assert r["with_search"] > 2 * r["without_search"], r


@pytest.mark.slow
def test_task_policy_build_runs_reading_then_demonstrations(tmp_path):
    from rllib_spear.models.sft import TASK_POLICY_OVERRIDES, TASK_POLICY_RECIPE, default_policy_path, task_policy_path

    over = TASK_POLICY_OVERRIDES["multi_answer_search"]
    recipe = {**TASK_POLICY_RECIPE, **over, "demo_passes": 1,
              "reading": dict(over["reading"], worlds=1, epochs=1, batch_size=64, max_len=256),
              "sft": dict(epochs=1, lr=1e-3, seed=0, max_len=256, batch_size=64)}
    path = Path(task_policy_path("multi_answer_search", tmp_path, recipe=recipe))
    assert "shipped" not in path.name  # not the default recipe: built here
    sft = json.loads((path / "sft_meta.json").read_text())
    reading = json.loads((Path(sft["base"]) / "sft_meta.json").read_text())
    assert reading["train_on"] == "all" and reading["epochs"] == 1 and sft["epochs"] == 1
    assert reading["base"] == default_policy_path(tmp_path)
    assert task_policy_path("multi_answer_search", tmp_path, recipe=recipe) == str(path)  # cached
