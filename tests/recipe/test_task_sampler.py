"""A training batch holds each task once (groups are found by uid), across epoch boundaries and
on datasets smaller than the batch; groups that come back incomplete are dropped and counted."""
from __future__ import annotations

from collections import Counter

from rllib_spear.pipelines.runner_requests import whole_groups
from rllib_spear.core.trajectory import Segment, Trajectory
from rllib_spear.recipe import TaskSampler


def _tasks(n: int) -> list[dict]:
    return [{"uid": f"t{i}", "question": f"q{i}"} for i in range(n)]


def test_batches_crossing_an_epoch_hold_distinct_tasks():
    # 6 tasks, 4 per batch: two of every three batches cross an epoch boundary, where the old
    # sampler could hand out a task twice (its second group and the first were both dropped).
    sampler = TaskSampler(_tasks(6), seed=0)
    served = []
    for _ in range(300):
        batch = [t["uid"] for t in sampler.next(4)]
        assert len(set(batch)) == 4, batch
        served.extend(batch)
    # every epoch still serves every task exactly once: 1200 draws = 200 epochs of 6
    assert Counter(served) == {f"t{i}": 200 for i in range(6)}


def test_text_game_sized_run_never_repeats_a_task_in_a_batch():
    # the shipped text-game set: the old sampler repeated a task in 28 of these 400 batches
    sampler = TaskSampler(_tasks(244), seed=0)
    for _ in range(400):
        batch = [t["uid"] for t in sampler.next(32)]
        assert len(set(batch)) == 32


def test_dataset_smaller_than_the_batch_gives_repeats_their_own_groups():
    sampler = TaskSampler(_tasks(3), seed=1)
    batch = sampler.next(7)
    uids = [t["uid"] for t in batch]
    assert len(set(uids)) == 7
    base = Counter(u.split("#")[0] for u in uids)
    assert sorted(base.values()) == [2, 2, 3]  # every task, then repeats
    assert {u for u in uids if "#" in u} <= {"t0#1", "t1#1", "t2#1", "t0#2", "t1#2", "t2#2"}
    # the repeat is a copy: the dataset's task keeps its uid
    assert [t["uid"] for t in sampler.tasks] == ["t0", "t1", "t2"]


def test_sampler_state_restores_the_swapped_order():
    a = TaskSampler(_tasks(6), seed=3)
    a.next(4)
    a.next(4)  # crossed a boundary, maybe swapped
    b = TaskSampler(_tasks(6), seed=99)
    b.set_state(a.get_state())
    assert [t["uid"] for t in a.next(5)] == [t["uid"] for t in b.next(5)]


def _traj(uid: str) -> Trajectory:
    return Trajectory(uid=uid, segments=[Segment("prompt", [1, 2])])


def test_whole_groups_counts_every_dropped_group():
    results = [{"trajectories": [_traj("a")] * 2 + [_traj("b")] * 4},  # b sent twice: 2G
               {"trajectories": [_traj("c")] * 1}]                     # c split by a failure
    kept, dropped = whole_groups(results, 2)
    assert [t.uid for t in kept] == ["a", "a"] and dropped == 2
