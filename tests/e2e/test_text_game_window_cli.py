"""The text game in the released agent tree's form, through the CLI as a user runs it
(configs/spear_text_game_cpu.yaml, shortened to 2 iterations): per-step samples with a history
window, group statistics over step rows, GiGPO and SIL's step admission, on the embedded model;
every learner sample stays within the released 2048 + 512 budget (docs/design.md "Sample layouts")."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "spear_text_game_cpu.yaml"


@pytest.mark.slow
def test_the_text_game_trains_with_window_steps_and_gigpo_through_the_cli(tmp_path):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "GLOO_SOCKET_IFNAME": "lo"}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(
        [sys.executable, "-m", "rllib_spear.cli", "train", str(CONFIG), "--set", "stop.training_iteration=2",
         "--set", f"storage_path={tmp_path}", "--set", "checkpoint_freq=0", "--set", "num_cpus=2",
         # the default policy has not learnt the game's format: keep its responses trainable
         "--set", "training.response_filters=[]", "--set", "training.group_filter_keep_fraction=null"],
        capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    assert [ln.split("|")[0].strip() for ln in out.stdout.splitlines() if ln.startswith("iter ")] == \
        ["iter   1", "iter   2"], out.stdout[-3000:]
    (result,) = list(tmp_path.glob("spear_text_game_cpu/SPEAR_*/result.json"))
    rows = [json.loads(line) for line in result.read_text().splitlines() if line.strip()]
    assert len(rows) == 2
    for r in rows:
        runners, learner = r["env_runners"], r["learners"]["default_policy"]
        # one sample per environment step: 4 tasks x 4 samples, up to 8 steps each
        assert runners["learner_samples"] == pytest.approx(runners["num_episodes"] * runners["turns_mean"])
        assert runners["learner_samples"] > runners["num_episodes"]
        # within the configured per-sample budget (1536 + 64) and the released 2048 + 512
        assert runners["sample_length_max"] <= 1536 + 64 <= 2048 + 512
        assert runners["response_length_mean"] > runners["sample_length_max"]  # the episode does not fit one sample
        # the learner trained on the step samples, each a sequence of its own
        assert learner["num_seqs"] == pytest.approx(runners["learner_samples"])
        assert learner["num_tokens"] > 0 and learner["num_optimizer_steps"] >= 1
