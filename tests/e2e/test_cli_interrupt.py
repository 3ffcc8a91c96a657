"""Ctrl-C on `rllib-spear train` ends the run (Tune saves its state and the CLI prints its summary)
instead of leaving a training process behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[2] / "configs" / "spear_cpu_demo.yaml"


@pytest.mark.slow
def test_ctrl_c_ends_a_training_run(tmp_path):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "GLOO_SOCKET_IFNAME": "lo"}
    env.pop("RAY_ADDRESS", None)
    env.pop("TUNE_DISABLE_SIGINT_HANDLER", None)  # the CLI as a user runs it
    proc = subprocess.Popen(
        [sys.executable, "-m", "rllib_spear.cli", "train", str(DEMO), "--set", f"storage_path={tmp_path}",
         "--set", "stop.training_iteration=1000", "--set", "checkpoint_freq=0", "--set", "num_cpus=2",
         "--set", "training.tasks_per_iteration=2", "--set", "training.group_size=2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("iter   2 |"):
            break
    assert seen and seen[-1].startswith("iter   2 |"), "".join(seen[-50:])
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("rllib-spear train did not stop on SIGINT")
    assert "Stop signal received" in out and "success by iterations" in out, out[-3000:]
    iterations = [ln for ln in out.splitlines() if ln.startswith("iter ")]
    assert len(iterations) < 20, "the run went on after Ctrl-C"
