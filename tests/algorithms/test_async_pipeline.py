"""The fully async pipeline's bookkeeping on a fake runner group (no Ray,
pipelines/fully_async.py): the submission window, oldest-first collection with the rest
kept for the next iteration, lag per oldest segment with stale groups dropped whole, runners that
die or restart (their groups are lost, counted and sampled again), failed groups, checkpoints of
the outstanding tasks, and the config knobs (docs/design.md "Fully asynchronous training")."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from rllib_spear import GRPOConfig
from rllib_spear.pipelines.fully_async import AsyncPipeline, merge_runner_stats
from rllib_spear.recipe import TaskSampler

G = 2


def _traj(uid, versions):
    return SimpleNamespace(uid=uid, segment_versions=list(versions), policy_version=min(versions),
                           task={"uid": uid})


class FakeRunner:
    """A stream: submitted groups finish when the test says so (``finish``), on the versions
    the test gives; ``take`` returns them."""

    def __init__(self, idx):
        self.worker_index, self.in_flight, self.done, self.submitted = idx, {}, [], []
        self.stopped = 0

    def stream_submit(self, requests):
        for r in requests:
            self.in_flight[r["key"]] = r
            self.submitted.append(r)
        return sorted(self.in_flight)

    def finish(self, versions=(0,), n=None, fail=False):
        for key in sorted(self.in_flight)[:n]:
            r = self.in_flight.pop(key)
            if fail:
                self.done.append(("fail", key))
            else:
                self.done.append((key, [_traj(r["task"]["uid"], versions) for _ in range(r["group_size"])]))

    def stream_take(self, min_groups=1, timeout_s=0.0):
        done, self.done = self.done, []
        return {"groups": [d for d in done if d[0] != "fail"],
                "failed": [(k, "RuntimeError: engine fault") for tag, k in done if tag == "fail"],
                "in_flight_keys": sorted(self.in_flight), "worker_index": self.worker_index,
                "stats": {"generated_tokens": 10, "generation_time_s": 1.0, "tool_latency_max_s": 0.5}}

    def stream_stop(self):
        n = len(self.in_flight) + len(self.done)
        self.in_flight, self.done = {}, []
        self.stopped += 1
        return n


class FakeGroup:
    def __init__(self, n=2):
        self.runners = {i: FakeRunner(i) for i in range(1, n + 1)}
        self.healthy = set(self.runners)
        self.on_call = None  # hook: called before every foreach (the test finishes groups there)

    def num_remote_env_runners(self):
        return len(self.runners)

    def healthy_env_runner_ids(self):
        return sorted(self.healthy)

    def probe_unhealthy_env_runners(self):
        return []

    def foreach_env_runner(self, funcs, *, local_env_runner, remote_worker_ids):
        if self.on_call is not None:
            self.on_call(self)
        return [f(self.runners[i]) for i, f in zip(remote_worker_ids, funcs) if i in self.healthy]


def _collect(p, group, sampler, step, version=None):
    return p.collect(group, sampler, step=step, version=step if version is None else version, run_seed=0,
                     resync=lambda: pytest.fail("no resync expected"))


def _sampler(n=50):
    return TaskSampler([{"uid": f"t{k}", "question": "q"} for k in range(n)], seed=0, shuffle=False)


def test_window_collection_order_and_leftovers():
    group, sampler = FakeGroup(2), _sampler()
    p = AsyncPipeline(max_policy_lag=1, tasks_per_iteration=2, group_size=G, poll_s=0.0)

    def finish_all(g):
        for r in g.runners.values():
            r.finish(versions=(0,))

    group.on_call = finish_all
    got = _collect(p, group, sampler, step=0)
    assert len(got.trajectories) == 4 and [t.uid for t in got.trajectories][::2] == ["t0", "t1"]
    assert got.lags == [0] * 4 and got.stale == got.lost == 0
    # the window: (1 + 1) x 2 = 4 groups submitted; after the batch took 2, k x B = 2 stay
    # outstanding (the two finished ones beyond the batch wait for the next iteration)
    assert p.outstanding == 2 and sampler.served == 4
    submitted = [r["task"]["uid"] for i in (1, 2) for r in group.runners[i].submitted]
    assert sorted(submitted) == [f"t{k}" for k in range(4)]
    loads = [len(r.submitted) for r in group.runners.values()]
    assert loads == [2, 2], "the least-loaded runner gets each task"
    assert len(got.runner_stats) == 2, "one merged stats dict per runner"
    group.on_call = None
    got = _collect(p, group, sampler, step=1)  # t2, t3 finished during the update: lag 1
    assert [t.uid for t in got.trajectories][::2] == ["t2", "t3"] and got.lags == [1] * 4


@pytest.mark.parametrize("lag", [1, 2])
def test_groups_finishing_in_order_are_never_older_than_k(lag):
    """The window's promise: groups that finish in submission order, sampled on the weights the
    runners held at submission, are all trained within ``max_policy_lag`` iterations (none is
    dropped), and the bound is reached (the runners sample ahead)."""
    group, sampler = FakeGroup(2), _sampler(200)
    p = AsyncPipeline(max_policy_lag=lag, tasks_per_iteration=3, group_size=G, poll_s=0.0)
    held = {"version": 0}
    submitted_at = {}

    def on_call(g):  # one group finishes per call, the oldest first, on its submission version
        pending = sorted((k, r) for r in g.runners.values() for k in r.in_flight)
        for key, r in pending:
            submitted_at.setdefault(key, held["version"])
        if pending:
            key, r = pending[0]
            req = r.in_flight.pop(key)
            r.done.append((key, [_traj(req["task"]["uid"], [submitted_at[key]]) for _ in range(G)]))

    group.on_call = on_call
    lags = []
    for step in range(8):
        got = _collect(p, group, sampler, step=step, version=step)
        assert got.stale == 0 and len(got.trajectories) == 3 * G
        lags += got.lags
        held["version"] = step + 1  # the sync after the update
    assert max(lags) == lag


def test_stale_and_unknown_versions_drop_whole_groups_oldest_segment_counts():
    group, sampler = FakeGroup(1), _sampler()
    p = AsyncPipeline(max_policy_lag=1, tasks_per_iteration=1, group_size=G, poll_s=0.0)
    runner = group.runners[1]
    # the segment versions of the groups, in the order they finish (one per runner call)
    script = iter([(0,), (0, 2), (2,), (99,)] + [(4,)] * 20)
    group.on_call = lambda g: runner.finish(versions=next(script), n=1) if runner.in_flight else None
    got = _collect(p, group, sampler, step=0)
    assert [t.uid for t in got.trajectories] == ["t0"] * G and got.lags == [0, 0]
    # t1 has a turn on version 0 and one on version 2: at step 2 it is as old as its oldest segment
    got = _collect(p, group, sampler, step=2, version=2)
    assert got.stale == G, "a partial rollout is as old as its oldest segment"
    assert [t.uid for t in got.trajectories] == ["t2"] * G and got.lags == [0, 0]
    # a version the pipeline never saw current (a runner restarted behind its back): dropped, and
    # the runners are brought to the current weights once (then the groups are fresh again)
    resyncs = []

    def resync():
        resyncs.append(1)
        return 4

    got = p.collect(group, sampler, step=3, version=3, run_seed=0, resync=resync)
    assert got.stale == G and resyncs == [1]
    assert [t.uid for t in got.trajectories] == ["t4"] * G and got.lags == [0, 0]


def test_dead_and_restarted_runners_lose_their_groups_which_are_sampled_again():
    group, sampler = FakeGroup(2), _sampler()
    p = AsyncPipeline(max_policy_lag=1, tasks_per_iteration=2, group_size=G, poll_s=0.0)
    r1, r2 = group.runners[1], group.runners[2]
    calls = {"n": 0}

    def script(g):
        calls["n"] += 1
        if calls["n"] == 2:  # after the first submission: runner 2 dies
            g.healthy.discard(2)
        r1.finish(versions=(0,))

    group.on_call = script
    got = _collect(p, group, sampler, step=0)
    lost_tasks = {r["task"]["uid"] for r in r2.submitted}
    assert got.lost == len(lost_tasks) == 2 and len(got.trajectories) == 4
    resent = [r["task"]["uid"] for r in r1.submitted]
    assert lost_tasks <= set(resent), "the lost tasks go again, to the runner left"
    assert len(resent) == len(set(resent)), "never twice to one runner"
    # runner 1 restarts behind the driver's back: its stream is new, the groups it had are lost
    group.on_call = None
    r1.in_flight.clear()
    res = p._foreach(group, {1: lambda r: r.stream_take(min_groups=1, timeout_s=0.0)})
    assert res[1]["in_flight_keys"] == []
    out = SimpleNamespace(lost=0, runner_stats=[])
    p._poll(group, {}, out, timeout_s=0.0)
    assert out.lost >= 1 and all(g.runner is None for g in p._groups.values() if g.result is None)


def test_a_failed_group_fails_the_iteration():
    group, sampler = FakeGroup(1), _sampler()
    p = AsyncPipeline(max_policy_lag=1, tasks_per_iteration=1, group_size=G, poll_s=0.0)
    group.on_call = lambda g: g.runners[1].finish(fail=True, n=1)
    with pytest.raises(RuntimeError, match="engine fault"):
        _collect(p, group, sampler, step=0)


def test_checkpoint_keeps_the_outstanding_tasks_and_drop_stops_the_streams():
    group, sampler = FakeGroup(2), _sampler()
    p = AsyncPipeline(max_policy_lag=1, tasks_per_iteration=2, group_size=G, poll_s=0.0)
    group.on_call = lambda g: g.runners[1].finish(versions=(0,))
    got = _collect(p, group, sampler, step=0)
    assert len(got.trajectories) == 4
    state = p.get_state()
    uids = [o["task"]["uid"] for o in state["outstanding"]]
    assert uids == sorted(uids, key=lambda u: int(u[1:])), "in submission order"
    assert len(state["outstanding"]) == 2 and p.checkpoint_sampler_state(sampler) == sampler.get_state()
    dropped = p.drop(group)
    assert dropped == G * 2 and all(r.stopped == 1 for r in group.runners.values())
    # a restored pipeline submits the outstanding tasks first, with their original seeds
    q = AsyncPipeline(max_policy_lag=1, tasks_per_iteration=2, group_size=G, poll_s=0.0)
    q.set_state(state)
    fresh = FakeGroup(2)
    fresh.on_call = lambda g: [r.finish(versions=(5,)) for r in g.runners.values()]
    again = _collect(q, fresh, sampler, step=3, version=5)
    sent = sorted((r["task"]["uid"], r["seed"]) for rr in fresh.runners.values() for r in rr.submitted)
    first = {(o["task"]["uid"]) for o in state["outstanding"]}
    assert first <= {u for u, _ in sent}
    assert sampler.served == 6, "two new tasks fill the window beside the two submitted again"
    seeds = {u: s for u, s in sent}
    old_seeds = {r["task"]["uid"]: r["seed"] for rr in group.runners.values() for r in rr.submitted}
    assert all(seeds[u] == old_seeds[u] for u in first), "the seeds follow the task's draw index"
    assert {t.uid for t in again.trajectories} <= first


def test_runner_stats_merge_over_windows():
    merged = merge_runner_stats([{"generated_tokens": 10, "generation_time_s": 1.0, "tool_latency_max_s": 0.5,
                                  "tool_latency_p50_s": 0.1},
                                 {"generated_tokens": 5, "generation_time_s": 0.5, "tool_latency_max_s": 0.2,
                                  "tool_latency_p50_s": 0.3}])
    assert merged == {"generated_tokens": 15, "generation_time_s": 1.5, "tool_latency_max_s": 0.5,
                      "tool_latency_p50_s": 0.3}


def test_config_knobs():
    cfg = GRPOConfig().training(rollout_pipeline="async", max_policy_lag=2).env_runners(rollout_mode="async")
    cfg.validate()
    assert cfg.policy_loss_config().tis_cap == 2.0
    GRPOConfig().training(rollout_pipeline="async").validate()  # rollout_mode="auto" picks the async loop
    with pytest.raises(ValueError, match="rollout_mode='async'"):
        GRPOConfig().training(rollout_pipeline="async").env_runners(rollout_mode="turn_sync").validate()
    with pytest.raises(ValueError, match="max_policy_lag"):
        GRPOConfig().training(rollout_pipeline="async", max_policy_lag=0).env_runners(rollout_mode="async").validate()
    with pytest.raises(ValueError, match="'sync', 'one_step_off' or 'async'"):
        GRPOConfig().training(rollout_pipeline="fully_async").validate()


def test_a_task_drawn_twice_in_the_window_is_two_groups_with_their_own_uids():
    """6 tasks, 4 per iteration, G=2, k=1: the window (8 groups) holds every task, some twice
    (the sampler draws one task per call, so it renames nothing). Every group of every batch must
    have its own uid, G trajectories each: one group of 2G would skew the advantages, the group
    filter, SIL's baseline and GiGPO's / SPADER's groups."""
    group = FakeGroup(2)
    sampler = TaskSampler([{"uid": f"t{k}", "question": "q"} for k in range(6)], seed=0)  # shuffled epochs
    p = AsyncPipeline(max_policy_lag=1, tasks_per_iteration=4, group_size=G, poll_s=0.0)
    group.on_call = lambda g: [r.finish(versions=(v,)) for r in g.runners.values()
                               for v in [held["version"]]]
    held = {"version": 0}
    seen_repeats = False
    for step in range(8):
        got = _collect(p, group, sampler, step=step, version=step)
        counts: dict = {}
        for t in got.trajectories:
            counts[t.uid] = counts.get(t.uid, 0) + 1
        assert len(counts) == 4 and set(counts.values()) == {G}, counts
        seen_repeats = seen_repeats or any("#" in u for u in counts)
        assert {u.split("#")[0] for u in counts} <= {f"t{k}" for k in range(6)}
        held["version"] = step + 1
    assert seen_repeats, "the window held a task twice (the case under test)"
    # the renamed tasks are what is outstanding: a checkpoint keeps their uids
    uids = [o["task"]["uid"] for o in p.get_state()["outstanding"]]
    assert len(uids) == len(set(uids))


def test_a_group_older_than_the_kept_versions_is_stale_without_a_resync():
    """k=1: a group submitted on version 0 that finishes at step 3 has a version the pipeline
    pruned (current more than k + 1 iterations ago). It is stale, dropped and counted, and the
    runners are not resynced (that is for versions a restarted runner brings)."""
    group, sampler = FakeGroup(1), _sampler()
    runner = group.runners[1]
    p = AsyncPipeline(max_policy_lag=1, tasks_per_iteration=1, group_size=G, poll_s=0.0)

    def newest_first(versions):  # one group per call, never the first (t0 stays in flight)
        def f(g):
            keys = [k for k in runner.in_flight if k != 0]
            if keys:
                key = max(keys)
                r = runner.in_flight.pop(key)
                runner.done.append((key, [_traj(r["task"]["uid"], versions) for _ in range(G)]))
        return f

    group.on_call = newest_first((0,))
    got = _collect(p, group, sampler, step=0, version=0)
    assert [t.uid for t in got.trajectories] == ["t1"] * G
    for step in (1, 2):
        group.on_call = newest_first((step,))
        got = _collect(p, group, sampler, step=step, version=step)
        assert len(got.trajectories) == G and got.stale == 0
    assert any(g.task["uid"] == "t0" for g in p._groups.values()), "t0 is still in flight"
    runner.finish(versions=(0,))  # t0 (and whatever else is in flight) on version 0, long pruned
    group.on_call = newest_first((3,))
    got = _collect(p, group, sampler, step=3, version=3)  # _collect fails on a resync
    assert got.stale >= G and len(got.trajectories) == G and got.lags == [0] * G
