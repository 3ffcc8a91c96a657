"""The one-step-off pipeline's bookkeeping on a fake runner group (no Ray): the launch / collect
schedule, the lag of every group, stale groups dropped whole, lost requests, checkpoints of the
task sampler, and the config knobs (docs/design.md "Rollout pipelining")."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from rllib_spear import GRPOConfig, SPEARConfig
from rllib_spear.pipelines.one_step_off import SAMPLE_TAG, OneStepOffPipeline
from rllib_spear.recipe import TaskSampler


class FakeRunner:
    def __init__(self, idx: int) -> None:
        self.idx, self.version, self.calls, self.seeds = idx, 0, 0, []

    def sample_groups(self, *, tasks, group_size, policy_version=None, seed=None):
        self.calls += 1
        self.seeds.append(seed)
        trajs = [SimpleNamespace(uid=t["uid"], traj_id=f"{self.idx}-{self.calls}-{t['uid']}-{g}",
                                 policy_version=self.version) for t in tasks for g in range(group_size)]
        return {"trajectories": trajs, "stats": {"worker_index": self.idx}}


class FakeGroup:
    """The EnvRunnerGroup calls the pipeline makes. A request runs at once on the weights its
    runner holds (a weight sync sent later queues behind it on the actor); fetching returns the
    results, newest first, without those of failed runners."""

    def __init__(self, n: int = 2) -> None:
        self.runners = {i: FakeRunner(i) for i in range(1, n + 1)}
        self.healthy = set(self.runners)
        self.in_flight: list[tuple[int, object, str]] = []
        self.failed: set[int] = set()

    def healthy_env_runner_ids(self):
        return sorted(self.healthy)

    def probe_unhealthy_env_runners(self):
        back = sorted(set(self.runners) - self.healthy)
        self.healthy |= set(back)
        return back

    def num_in_flight_async_reqs(self, tag=None):
        return sum(1 for _, _, t in self.in_flight if tag is None or t == tag)

    def foreach_env_runner_async(self, funcs, tag=None, *, remote_worker_ids):
        self.in_flight += [(i, f(self.runners[i]), tag) for i, f in zip(remote_worker_ids, funcs)]
        return len(funcs)

    def fetch_ready_async_reqs(self, *, tags=None, timeout_seconds=0.0):
        mine = [r for r in self.in_flight if r[2] == tags]
        self.in_flight = [r for r in self.in_flight if r[2] != tags]
        return [(i, out) for i, out, _ in reversed(mine) if i not in self.failed]

    def sync(self, version: int) -> None:
        for i in self.healthy:
            self.runners[i].version = version


def _tasks(n, start=0):
    return [{"uid": f"t{k}"} for k in range(start, start + n)]


def _launch(p, group, tasks, step, version):
    p.launch(group, tasks, 2, step=step, version=version, sampler_state={"at": step},
             resync=lambda: pytest.fail("no resync expected"))


def test_schedule_versions_and_lag():
    """Iteration k (k-1 updates done) trains the batch sampled k-1 launches ago: lag 0, then 1."""
    group, p = FakeGroup(2), OneStepOffPipeline(max_policy_lag=1)
    step = 0
    _launch(p, group, _tasks(4), step, 0)  # the first iteration: nothing in flight yet
    for k in range(1, 5):
        got = p.collect(group, step)
        _launch(p, group, _tasks(4, 4 * k), step, step)  # the next batch, on the weights now
        assert p.in_flight and group.num_in_flight_async_reqs(SAMPLE_TAG) == 2
        assert len(got.trajectories) == 8 and got.stale == 0 and got.lost == 0
        assert got.lags == [0 if k == 1 else 1] * 8 and got.lag_max == (0 if k == 1 else 1)
        assert {t.policy_version for t in got.trajectories} == {max(k - 2, 0)}
        # dealing order, not arrival order (the fake answers in reverse)
        assert [s["worker_index"] for s in got.runner_stats] == [1, 2]
        step += 1  # the update ...
        group.sync(step)  # ... and the weight sync, queued behind the request in flight


def test_sequential_sil_two_updates_per_iteration_is_still_lag_one():
    group, p = FakeGroup(1), OneStepOffPipeline(max_policy_lag=1)
    _launch(p, group, _tasks(2), 0, 0)
    version = 0
    for step in range(3):
        got = p.collect(group, step)
        _launch(p, group, _tasks(2), step, version)
        assert got.stale == 0 and got.lag_max == (0 if step == 0 else 1)
        version += 2  # on-policy update + SIL update
        group.sync(version)


def test_stale_and_unknown_versions_drop_whole_groups():
    group, p = FakeGroup(2), OneStepOffPipeline(max_policy_lag=1)
    _launch(p, group, _tasks(4), 0, 0)
    p.collect(group, 0)
    group.sync(1)
    # runner 2 holds a version the pipeline never launched with (e.g. restarted behind the
    # driver's back, or a request from before a restore)
    group.runners[2].version = 7
    _launch(p, group, _tasks(4), 1, 1)
    got = p.collect(group, 1)
    assert got.stale == 4 and len(got.trajectories) == 4
    assert {t.policy_version for t in got.trajectories} == {1}
    # lag 2 > max_policy_lag: every group dropped
    group.sync(1)
    _launch(p, group, _tasks(4), 1, 1)
    assert p.collect(group, 3).stale == 8


def test_failed_runner_request_is_lost_and_counted():
    group, p = FakeGroup(2), OneStepOffPipeline()
    _launch(p, group, _tasks(4), 0, 0)
    group.failed.add(1)
    got = p.collect(group, 0)
    assert got.lost == 1 and len(got.trajectories) == 4 and got.stale == 0


def test_all_runners_down_resyncs_before_launch():
    group, p = FakeGroup(2), OneStepOffPipeline()
    group.healthy.clear()
    calls = []

    def resync():
        calls.append(1)
        group.sync(5)
        return 5

    p.launch(group, _tasks(2), 2, step=3, version=2, sampler_state={}, resync=resync)
    got = p.collect(group, 3)
    assert calls == [1] and got.lag_max == 0 and {t.policy_version for t in got.trajectories} == {5}


def test_drop_and_checkpointed_sampler_state():
    group, p = FakeGroup(2), OneStepOffPipeline()
    sampler = TaskSampler(_tasks(10), seed=0)
    before = sampler.get_state()
    p.launch(group, sampler.next(4), 2, step=0, version=0, sampler_state=before, resync=lambda: 0)
    # a checkpoint now stores the sampler before the in-flight draw: a restore redraws those tasks
    assert p.checkpoint_sampler_state(sampler) == before
    redraw = TaskSampler(_tasks(10), seed=0)
    redraw.set_state(p.checkpoint_sampler_state(sampler))
    assert redraw.next(4) == TaskSampler(_tasks(10), seed=0).next(4)
    assert p.drop(group) == 8 and not p.in_flight and group.num_in_flight_async_reqs() == 0
    assert p.checkpoint_sampler_state(sampler) == sampler.get_state()
    with pytest.raises(RuntimeError, match="no sample in flight"):
        p.collect(group, 0)


def test_sampling_seeds_follow_the_draw_not_the_runner_call_count():
    """A runner's seed comes from (run seed, draw, runner id): a restored sampler or a restarted
    runner (whose own call counter starts at 0 again) samples a draw with the original seeds."""
    sampler = TaskSampler(_tasks(10), seed=0)
    group, p = FakeGroup(2), OneStepOffPipeline()
    seeds = []
    for _ in range(3):
        before, key = sampler.get_state(), (7, sampler.served)
        p.launch(group, sampler.next(4), 2, step=0, version=0, sampler_state=before, resync=lambda: 0, seed_key=key)
        p.collect(group, 0)
        seeds.append([r.seeds[-1] for r in group.runners.values()])
    assert len({s for row in seeds for s in row}) == 6  # every share of every draw its own seed
    # a restored run: the sampler state of draw 2, fresh runners (their call counters at 0)
    restored, group2 = TaskSampler(_tasks(10), seed=0), FakeGroup(2)
    restored.next(4)
    restored.next(4)
    p2, key = OneStepOffPipeline(), (7, restored.served)
    p2.launch(group2, restored.next(4), 2, step=0, version=0, sampler_state={}, resync=lambda: 0, seed_key=key)
    assert [r.seeds[-1] for r in group2.runners.values()] == seeds[2]


def test_config_knobs():
    def cfg(**kw):
        return GRPOConfig().rl_module(model_config={"model_path": "embedded"}).training(**kw)

    base = cfg()
    assert base.rollout_pipeline == "sync" and base.max_policy_lag == 1
    assert base.policy_loss_config().tis_cap is None  # default: today's loss
    off = cfg(rollout_pipeline="one_step_off")
    off.validate()
    # behaviour log-probs one update old: truncated IS on by default, never on the SIL replay loss
    assert off.policy_loss_config().tis_cap == 2.0 and off.policy_loss_config(replay=True).tis_cap is None
    assert cfg(rollout_pipeline="one_step_off", tis_cap=0).policy_loss_config().tis_cap is None
    assert SPEARConfig().training(rollout_pipeline="one_step_off", tis_cap=3.0).policy_loss_config().tis_cap == 3.0
    cfg(rollout_pipeline="async").validate()  # rollout_mode="auto" runs the async loop it needs
    with pytest.raises(ValueError, match="rollout_pipeline"):
        cfg(rollout_pipeline="async").env_runners(rollout_mode="turn_sync").validate()
    for kw, match in [({"max_policy_lag": -1}, "max_policy_lag"),
                      ({"max_policy_lag": 1.5}, "max_policy_lag"),
                      ({"rollout_pipeline": "one_step_off", "max_policy_lag": 0}, "max_policy_lag")]:
        with pytest.raises(ValueError, match=match):
            cfg(**kw).validate()
    with pytest.raises(ValueError, match="num_env_runners"):
        cfg(rollout_pipeline="one_step_off").env_runners(num_env_runners=0).validate()
