"""The real-model learning benchmark's trial config (benchmarks/real_model_learning.py): LoRA on the
top layers only, sampling in the driver with the chosen engine, and the held-out task's files
passed as a user passes their own data. Built on a tiny model; no training."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import real_model_learning as rml  # noqa: E402

from rllib_spear.data.heldout_search import write_heldout_search_task  # noqa: E402
from rllib_spear.models.factory import tiny_model_path  # noqa: E402


def _args(model: str, **kw) -> argparse.Namespace:
    base = dict(model_path=model, lora_rank=4, lora_layers=1, engine="hf", task_files=None, max_turns=3,
                group_size=4, tasks=4, lr=3e-4, iterations=7, sil_capacity=8, cpus=2)
    return argparse.Namespace(**{**base, **kw})


@pytest.fixture(scope="module")
def model() -> str:
    return tiny_model_path(layers=3)


def test_lora_on_the_top_layers_and_a_driver_runner(model):
    cfg = rml.real_model_config("SPEAR", {}, "search_qa", 0, _args(model, lora_layers=2))
    lora = cfg.model_config["lora"]
    assert lora["r"] == 4 and lora["lora_alpha"] == 8
    assert lora["layers_to_transform"] == [1, 2]  # the top 2 of 3 layers
    assert cfg.num_env_runners == 0 and cfg.create_local_env_runner
    assert cfg.engine == "hf" and cfg.seed == 0
    # the schedules are scaled to the run: half of it with the tool bonus
    assert cfg.tool_reward_steps == 3
    full = rml.real_model_config("DrBoT", {}, "search_qa", 1, _args(model, lora_layers=0, lora_rank=0))
    assert "lora" not in full.model_config


def test_heldout_task_files_reach_the_env(model, tmp_path):
    files = write_heldout_search_task(tmp_path / "heldout")
    cfg = rml.real_model_config("DrBoT", {}, "search_qa", 0, _args(model, task_files=files))
    assert cfg.dataset == files["dataset"]
    assert cfg.env_config["corpus_path"] == files["corpus"] and cfg.env_config["max_turns"] == 3
