"""benchmarks/gpu_rllib_iteration.py -- the device kit's first RLlib iteration on a GPU -- runs its
whole sequence on CPU (``--cpu-smoke``: one remote learner in a gloo group of one, one runner with
the HF engine, the tiny model): GRPO and SPEAR each build, train one iteration with the weight
sync, checkpoint, restore into a fresh algorithm and train once more; every stage reports ok."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_rllib_iteration.py"
STAGES = ("env", "model") + tuple(f"{algo}_{stage}" for algo in ("grpo", "spear")
                                  for stage in ("build", "iteration", "checkpoint", "restored_iteration"))


def _run(out: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}
    res = subprocess.run([sys.executable, str(SCRIPT), "--cpu-smoke", "--out", str(out), *args],
                         capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return res, records


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("gpu_rllib") / "rllib_iteration.jsonl")


def test_cpu_smoke_runs_every_stage_ok(smoke):
    res, records = smoke
    assert [r["stage"] for r in records] == list(STAGES), res.stdout[-3000:] + res.stderr[-3000:]
    failed = {r["stage"]: r.get("error") or r.get("checks") for r in records if not r["ok"]}
    assert not failed, failed
    assert res.returncode == 0
    # one JSON line per stage on stdout too, and the stages' progress lines
    printed = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert [p["stage"] for p in printed] == list(STAGES)
    assert "[gpu-rllib] done: 10 of 10 stages ok" in res.stdout


def test_cpu_smoke_reports_the_learner_group_the_sync_and_the_restore(smoke):
    _, records = smoke
    by = {r["stage"]: r for r in records}
    for algo in ("grpo", "spear"):
        build = by[f"{algo}_build"]
        learner = build["learner"]
        assert learner["backend"] == "gloo" and learner["world_size"] == 1
        assert learner["all_gather_object"]["gathered"][0]["rank"] == 0
        assert build["runner"]["engine_device"] == "cpu" and build["runner"]["gpu_ids"] == []
        it = by[f"{algo}_iteration"]
        assert it["policy_version"] == 1 and it["runner"]["weights_version"] == 1
        assert it["metrics"]["generated_tokens"] > 0 and it["metrics"]["grad_norm"] > 0
        ck = by[f"{algo}_checkpoint"]
        assert ck["restored_version"] == ck["saved_version"] == 1
        assert ck["restored_digest"] == ck["saved_digest"]
        assert by[f"{algo}_restored_iteration"]["policy_version"] == 2
    env = by["env"]
    assert env["versions"]["ray"] and env["run"] == "cpu-smoke"


@pytest.mark.slow
def test_cpu_smoke_of_the_learning_stage(tmp_path):
    """SPEAR and Dr.BoT side by side, one iteration each (the tiny model in place of the SmolLM2
    cold start)."""
    res, records = _run(tmp_path / "learning.jsonl", "--stage", "learning", "--iterations", "1", "--tasks", "2",
                        "--group-size", "4")
    assert [r["stage"] for r in records] == ["env", "model", "learning_build", "learning_spear_1", "learning_drbot_1"], \
        res.stdout[-3000:] + res.stderr[-3000:]
    assert all(r["ok"] for r in records), [r for r in records if not r["ok"]]
    assert {records[3]["method"], records[4]["method"]} == {"SPEAR", "Dr.BoT"}
