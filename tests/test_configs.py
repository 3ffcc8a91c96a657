"""Every recipe in configs/ loads through the CLI's builder and passes validate() (no build)."""
from __future__ import annotations

from pathlib import Path

import pytest

from rllib_spear.cli import block_means, build_config, load_experiment

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


def test_configs_exist():
    names = {p.name for p in CONFIGS}
    for n in ("spear_cpu_demo.yaml", "spear_qwen2.5_1.5b_search.yaml", "spear_qwen2.5_7b_search.yaml",
              "spear_qwen2.5_32b_code_math.yaml", "spear_qwen2.5_1.5b_text_game.yaml",
              "drbot_qwen2.5_1.5b_search.yaml", "grpo_qwen2.5_1.5b_search.yaml"):
        assert n in names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_builds_and_validates(path):
    exp = load_experiment(str(path))
    assert exp.get("algorithm") and exp.get("name")
    cfg = build_config(exp)
    cfg.validate(check_files=False)  # the GPU recipes name a cluster's folders
    assert cfg.model_config["model_path"]
    # every training key of the file landed on the config (a typo would be silently ignored)
    for key, value in ((exp.get("config") or {}).get("training") or {}).items():
        got = getattr(cfg, key)
        if isinstance(value, list):
            got, value = list(got), list(value)
        assert got == value, (key, got, value)


def test_math_recipe_values():
    cfg = build_config(load_experiment(str(CONFIGS[0].parent / "spear_qwen2.5_32b_code_math.yaml")))
    assert (cfg.tasks_per_iteration, cfg.group_size, cfg.max_response_tokens, cfg.max_turns) == (128, 16, 16384, 8)
    assert cfg.sil_require_tool_call is True and cfg.sil_keep_zero is False
    assert cfg.sil_weight_steps == 300 and cfg.entropy_coeff == 0.0 and cfg.engine == "vllm"
    agent = build_config(load_experiment(str(CONFIGS[0].parent / "spear_qwen2.5_1.5b_search.yaml")))
    assert (agent.tasks_per_iteration, agent.group_size, agent.lr, agent.weight_decay, agent.grad_clip) == (32, 8, 1e-6, 0.01, 1.0)
    assert agent.entropy_coeff == 0.001 and agent.sil_weight_steps == 200 and agent.tool_reward_steps == 200
    assert agent.num_gpus_per_env_runner == 1 and agent.num_gpus_per_learner == 1


def test_block_means_summarise_the_trend():
    assert block_means([0.0, 0.2, 0.4, 0.6, 0.8, 1.0], blocks=3) == [(1, 2, 0.1), (3, 4, 0.5), (5, 6, 0.9)]
    assert block_means([1.0, 2.0, 3.0, 4.0, 5.0], blocks=2) == [(1, 2, 1.5), (3, 5, 4.0)]
    assert block_means([0.5], blocks=6) == [(1, 1, 0.5)]
    assert block_means([], blocks=6) == []
