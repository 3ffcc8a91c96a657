"""Colocated iterations that fail after the engines slept (GRPO.training_step on fakes, no Ray):
a failing learner update, SIL step or weight sync must leave every engine awake and the sync
owed, and the next iteration (or evaluation) must sync before it samples, or fail without
sampling when that sync fails again (docs/design.md "Cluster placement")."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

import rllib_spear.algorithms.grpo.grpo as grpo_module
from rllib_spear.pipelines.colocation import EngineSleepCycle
from rllib_spear.algorithms.grpo.grpo import GRPO


class _Runner:
    def __init__(self, log):
        self.log, self.version = log, 0

    def sleep_engine(self, level):
        self.log.append(f"sleep({level})")
        if level == 2:  # the weights are dropped: no valid version until the next sync
            self.version = -1
        return self.version

    def wake_engine(self, tags):
        self.log.append(f"wake({','.join(tags)})")
        return self.version


class _Group:
    def __init__(self, log):
        self.runners = [_Runner(log)]

    def num_remote_env_runners(self):
        return 1

    def foreach_env_runner(self, fn, local_env_runner=False):
        return [fn(r) for r in self.runners]


class _Recipe:
    def __init__(self):
        self.fail_after_update = False

    def shape_rewards(self, trajs, step):
        return {}

    def advantages(self, trajs):
        return None

    def filter(self, trajs):
        return SimpleNamespace(fractions={}, filtered=[False] * len(trajs))

    def learner_rows(self, trajs, adv, kept):
        return []

    def replay(self, step):
        return SimpleNamespace(joint=False, rows=[])

    def after_update(self, trajs, adv, kept, step, replay):
        if self.fail_after_update:
            raise RuntimeError("SIL step failed")
        return {}


def _algo(monkeypatch, level=2):
    """A colocated GRPO whose runners, learners, sampling and sync are fakes; ``faults`` says
    which stage raises; ``log`` records every call in order."""
    log: list = []
    faults = {"update": False, "sync": False}
    algo = object.__new__(GRPO)
    algo.config = SimpleNamespace(tasks_per_iteration=1, group_size=2, sharding="ddp",
                                  weight_sync_transport="object_store", engine="hf", weight_sync_bucket_mb=1,
                                  weight_transfer_backend="auto", num_gpus_per_learner=0, colocate=True,
                                  log_samples=0)
    algo.metrics = MetricsLogger()
    algo.env_runner_group = _Group(log)
    algo.learner_group = SimpleNamespace(foreach_learner=lambda fn: SimpleNamespace(result_or_errors=[]))
    algo.recipe = _Recipe()
    algo.algo_step, algo._policy_version, algo._sync_owed = 0, 0, False
    algo._sleep_cycle = EngineSleepCycle(level)

    def next_batch():
        assert all(r.version >= 0 for r in algo.env_runner_group.runners), "sampled on dropped weights"
        log.append("sample")
        return [SimpleNamespace(uid="t0")], []

    def update(rows, step):
        log.append("update")
        if faults["update"]:
            raise RuntimeError("update failed")

    def sync(learner_group, group):
        log.append("sync")
        if faults["sync"]:
            raise RuntimeError("sync failed")
        for r in group.runners:
            r.version = algo._policy_version + 1
        return algo._policy_version + 1

    algo.next_batch, algo.update_learners = next_batch, update
    algo._log_rollout_metrics = lambda *a, **k: None
    monkeypatch.setattr(grpo_module, "run_trajectory_callbacks", lambda *a, **k: None)
    algo.weight_sync = sync
    return algo, log, faults


def _awake(algo):
    return algo._sleep_cycle.asleep == ()


@pytest.mark.parametrize("stage", ["update", "sil", "sync"])
def test_a_failure_after_sleep_wakes_the_engines_and_the_next_iteration_syncs_first(monkeypatch, stage):
    algo, log, faults = _algo(monkeypatch)
    algo.training_step()
    assert log == ["sample", "sleep(2)", "update", "wake(weights)", "sync", "wake(kv_cache)"]
    log.clear()
    faults["update"] = stage == "update"
    faults["sync"] = stage == "sync"
    algo.recipe.fail_after_update = stage == "sil"
    with pytest.raises(RuntimeError, match={"update": "update failed", "sil": "SIL step failed",
                                            "sync": "sync failed"}[stage]):
        algo.training_step()
    assert _awake(algo), f"engines left asleep: {algo._sleep_cycle.asleep}"
    assert log[-1].startswith("wake"), log
    assert algo._sync_owed
    faults["update"] = faults["sync"] = algo.recipe.fail_after_update = False
    log.clear()
    algo.training_step()  # the owed sync comes before any sampling
    assert log[0] == "sync" and log.index("sync") < log.index("sample"), log
    assert log.count("sync") == 2 and not algo._sync_owed  # the owed sync, then the iteration's own
    assert algo.policy_version == 3


def test_the_next_iteration_refuses_to_sample_while_the_sync_keeps_failing(monkeypatch):
    algo, log, faults = _algo(monkeypatch)
    faults["sync"] = True
    with pytest.raises(RuntimeError, match="sync failed"):
        algo.training_step()
    log.clear()
    with pytest.raises(RuntimeError, match="sync failed"):
        algo.training_step()
    assert "sample" not in log and log[0] == "sync", log
    assert _awake(algo) and algo._sync_owed
    faults["sync"] = False
    algo.training_step()
    assert not algo._sync_owed


def test_a_failing_wake_does_not_hide_the_iterations_error(monkeypatch):
    algo, log, faults = _algo(monkeypatch)
    faults["update"] = True
    runner = algo.env_runner_group.runners[0]
    runner.wake_engine = lambda tags: (_ for _ in ()).throw(OSError("runner gone"))
    with pytest.raises(RuntimeError, match="update failed"):
        algo.training_step()
    assert algo._sync_owed and not _awake(algo)
    del runner.wake_engine  # the runner answers again: the next iteration wakes, syncs, samples
    faults["update"] = False
    log.clear()
    algo.training_step()
    assert log[:3] == ["wake(weights)", "sync", "wake(kv_cache)"] and log[3] == "sample", log
