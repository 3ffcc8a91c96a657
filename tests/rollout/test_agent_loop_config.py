"""The agent-loop knobs of ``.env_runners(...)`` (docs/design.md "The agent loop"): defaults,
validate() errors naming the knob, and the loop counters reaching the iteration's metrics."""
from __future__ import annotations

import inspect

import pytest

from rllib_spear import GRPOConfig
from rllib_spear.env_runners.async_rollout import DEFAULT_TOOL_TIMEOUT_S, AsyncMultiTurnRollout
from rllib_spear.env_runners.rollout import RolloutStats
from rllib_spear.metrics import rollout_metrics
from rllib_spear.testing import make_stats


def test_defaults_pick_the_loop_and_the_async_knobs():
    cfg = GRPOConfig()
    assert cfg.rollout_mode == "auto" and cfg.tool_concurrency is None  # tests/rollout/test_rollout_mode_auto.py
    default = inspect.signature(AsyncMultiTurnRollout).parameters["tool_timeout_s"].default
    assert cfg.tool_timeout_s == DEFAULT_TOOL_TIMEOUT_S == default
    cfg.env_runners(rollout_mode="async", tool_concurrency=4, tool_timeout_s=None)
    assert (cfg.rollout_mode, cfg.tool_concurrency, cfg.tool_timeout_s) == ("async", 4, None)
    cfg.validate(check_files=False)


@pytest.mark.parametrize("kw, match", [
    ({"rollout_mode": "fast"}, "`rollout_mode` must be 'auto', 'turn_sync'(,| or) 'async'"),  # the registered names
    ({"tool_concurrency": 0}, "`tool_concurrency` must be an integer >= 1"),
    ({"tool_concurrency": 2.5}, "`tool_concurrency` must be an integer >= 1"),
    ({"tool_timeout_s": 0}, "`tool_timeout_s` must be a number of seconds > 0"),
    ({"tool_timeout_s": True}, "`tool_timeout_s` must be a number of seconds > 0"),
])
def test_bad_agent_loop_knobs_fail_validate_naming_them(kw, match):
    cfg = GRPOConfig().env_runners(**kw)
    with pytest.raises(ValueError, match=match):
        cfg.validate(check_files=False)


def test_loop_counters_reach_the_rollout_metrics():
    a = RolloutStats(engine_idle_s=1.5, tool_latencies_s=[0.1, 0.2, 0.3, 4.0], concurrent_episodes_max=8,
                     concurrent_episodes_mean=5.0, tool_calls_concurrent_max=6, tool_timeouts=1, tool_calls_abandoned=1)
    b = RolloutStats(engine_idle_s=0.5, tool_latencies_s=[0.5], concurrent_episodes_max=4,
                     concurrent_episodes_mean=3.0, tool_timeouts=2)
    la = a.loop_metrics()
    assert la["tool_latency_p50_s"] == pytest.approx(0.25) and la["tool_latency_max_s"] == 4.0
    assert la["tool_calls"] == 4 and RolloutStats().loop_metrics()["tool_latency_p95_s"] == 0.0
    from rllib_spear.core.trajectory import Segment, Trajectory

    traj = Trajectory("u", [Segment("prompt", [1]), Segment("assistant", [2], [-0.1], step=0)], stats=make_stats())
    m = rollout_metrics([traj], [a.loop_metrics(), b.loop_metrics()])
    assert m["engine_idle_s"] == 2.0 and m["tool_timeouts"] == 3 and m["tool_calls_abandoned"] == 1
    assert m["tool_latency_max_s"] == 4.0 and m["concurrent_episodes_max"] == 8
    assert m["concurrent_episodes_mean"] == 4.0 and m["tool_calls_concurrent_max"] == 6
    assert "engine_idle_s" not in rollout_metrics([traj], [{"generation_time_s": 1.0}])  # older stats: absent
