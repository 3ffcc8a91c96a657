"""examples/custom_tool_env.py: SPEAR through Tune on the example's own env, with its env given each
of the three ways (class, "module:Class", registered name), 2 iterations on 2 remote env runners."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the example is imported as examples.custom_tool_env


@pytest.fixture(scope="module")
def ray_session():
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    started = not ray.is_initialized()
    if started:
        # py_modules: workers import examples.custom_tool_env whatever the driver's cwd
        ray.init(num_cpus=2, include_dashboard=False, runtime_env={
            "env_vars": {"RAY_AUTH_MODE": "disabled"}, "py_modules": [str(REPO / "examples")]})
    yield ray
    if started:
        ray.shutdown()


@pytest.mark.parametrize("env_as, tasks", [("class", "list"), ("path", "parquet"), ("name", "list")])
def test_example_trains_with_the_env_given_as(ray_session, env_as, tasks, tmp_path):
    from examples import custom_tool_env as ex

    results = ex.train(env_as, iterations=2, tasks=tasks, storage_path=tmp_path, verbose=False)
    assert [r["training_iteration"] for r in results] == [1, 2]
    assert results[-1]["config"]["env"] == {"class": ex.CityFactsEnv, "path": "examples.custom_tool_env:CityFactsEnv",
                                            "name": "city_facts"}[env_as]
    for r in results:
        m = r["env_runners"]
        assert m["num_episodes"] == 8  # 2 tasks x group_size 4, sampled by the two remote runners
        # The user reward ran on every episode: tidy_answer reads stats.extra["tool_errors"] and
        # ["answer"], keys only FunctionToolEnv's stats have (another env's episode would stop the run).
        assert "reward_fns/tidy_answer_mean" in m, sorted(m)
        assert -1.0 <= m["reward_fns/tidy_answer_mean"] <= 0.1
        assert "em_mean" in m and "tool_calls_per_episode" in m  # the env's exact-match score and counters
