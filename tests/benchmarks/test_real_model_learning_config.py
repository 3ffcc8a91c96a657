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


def _runs(spear: list[float], drbot: list[float]):
    import pandas as pd

    rows = []
    for variant, finals in (("SPEAR", spear), ("DrBoT", drbot)):
        for seed, final in enumerate(finals):
            for it, success in ((1, 0.0), (2, final)):
                rows.append(dict(variant=variant, algorithm=variant, env="search_qa", seed=seed, iteration=it,
                                 success=success, tool_call_rate=0.5))
    return pd.DataFrame(rows)


def test_must_show_checks_are_this_issues():
    """+5 points of final success (last iteration, mean over seeds) and 2 seeds per method; no
    check of the learning benchmark's (iterations to reach, 3 seeds) is printed here."""
    title, checks = rml.real_model_checks(_runs([0.5, 0.3], [0.4, 0.3]), 0.35, 1)
    assert "0.6x" not in title and "3 seeds" not in title and ">= 2 seeds per method" in title
    assert checks == ["SPEAR final 0.400 vs Dr.BoT 0.350: +5.0 points (PASS)",
                      "seeds per method: DrBoT 2, SPEAR 2 (PASS)"]
    _, checks = rml.real_model_checks(_runs([0.4], [0.4]), 0.4, 1)
    assert checks == ["SPEAR final 0.400 vs Dr.BoT 0.400: +0.0 points (FAIL)",
                      "seeds per method: DrBoT 1, SPEAR 1 (FAIL: fewer than 2)"]
