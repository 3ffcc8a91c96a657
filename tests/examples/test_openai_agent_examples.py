"""examples/openai_agent: the plain ``openai``-client calculator agent trains for 2 iterations on
the tiny model through ``rollout_mode="agent_program"``; so does the OpenAI Agents SDK version
(``openai-agents`` is in the ``test`` extra, so CI runs it; skipped where it is not installed)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("fastapi")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "openai_agent"
sys.path.insert(0, str(EXAMPLES))


@pytest.fixture(scope="module")
def ray_session():
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled"}})
    yield ray
    if started:
        ray.shutdown()


def test_the_calculator_is_a_plain_function():
    import calculator_agent as ex

    assert ex.calculator("17 * 23") == "391" and ex.calculator("(1 + 2) / 4") == "0.75"
    with pytest.raises(ValueError):
        ex.calculator("__import__('os')")
    assert all(t["answer"] == ex.calculator(t["question"][8:-1]) for t in ex.tasks(4))


def test_the_calculator_agent_trains(ray_session):
    import calculator_agent as ex
    from rllib_spear.models.factory import tiny_model_path

    # num_env_runners=0: the runner is in this process (a test module is not importable in a
    # remote runner; the example run as a script ships its program by value)
    results = ex.train(tiny_model_path(), iterations=2, num_env_runners=0)
    assert [r["training_iteration"] for r in results] == [1, 2]
    for r in results:
        m = r["env_runners"]
        assert m["num_episodes"] == 8 and m["agent_program_errors"] == 0 and m["turns_mean"] >= 1


def test_the_agents_sdk_agent_trains(ray_session):
    pytest.importorskip("agents", reason="the OpenAI Agents SDK is not installed (pip install openai-agents)")
    import agents_sdk_agent as ex
    from rllib_spear.models.factory import tiny_model_path

    results = ex.train(tiny_model_path(), iterations=2, num_env_runners=0)
    assert [r["training_iteration"] for r in results] == [1, 2]
    assert all(r["env_runners"]["agent_program_errors"] == 0 for r in results)
