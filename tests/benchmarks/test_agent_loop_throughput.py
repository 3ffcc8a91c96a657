"""benchmarks/agent_loop_throughput.py: the latency wrapper draws the same latencies for the same
(instance, episode, step) in both modes, and a short run prints both modes and their ratio."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import agent_loop_throughput as bench  # noqa: E402


class _Inner:
    def reset(self, task):
        return [{"role": "user", "content": "q"}]

    def step(self, text):
        return text

    def episode_stats(self):
        return {}


def _draws(instance, latency="lognormal", episodes=2, steps=3):
    env = bench.LatencyEnv(_Inner(), instance, latency, median=0.1, sigma=1.0, seed=0)
    out = []
    for _ in range(episodes):
        env.reset({})
        for _ in range(steps):
            env.steps += 1
            out.append(env.draw())
    return out


def test_latency_draws_are_a_function_of_instance_episode_and_step():
    assert _draws(0) == _draws(0) and _draws(0) != _draws(1)
    assert _draws(0, "zero") == [0.0] * 6
    many = [d for i in range(200) for d in _draws(i)]
    assert np.median(many) == pytest.approx(0.1, rel=0.2)  # lognormal, median 0.1 s
    assert np.std(np.log(many)) == pytest.approx(1.0, rel=0.15) and min(many) > 0
    assert math.isfinite(max(many))


def test_bad_latency_is_refused():
    with pytest.raises(SystemExit):
        bench.main(["--latency", "slow"])


def test_short_run_prints_both_modes_and_the_ratio(capsys):
    bench.main(["--model", "tiny", "--tasks", "2", "--group", "2", "--max-new", "8", "--max-turns", "2",
                "--reps", "1", "--latency", "lognormal,zero", "--median", "0.01"])
    out = capsys.readouterr().out
    for latency in ("lognormal", "zero"):
        assert f"[hf, {latency}] turn_sync" in out and f"[hf, {latency}] async" in out
        assert f"[hf, {latency}] async / turn_sync:" in out
    assert "engine idle" in out
