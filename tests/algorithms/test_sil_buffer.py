"""SPEAR self-imitation replay buffer: hand-computed, scripted sequences (docs/algorithms.md 2.2)."""
from __future__ import annotations

import itertools
import json
import math
import pickle

import pytest

from rllib_spear.testing import make_stats
from rllib_spear.recipe.sil_buffer import (
    SILReplayBuffer,
    nearest_lower_power_of_2,
)
from rllib_spear.core.trajectory import Segment, Trajectory

_ids = itertools.count()


def traj(reward: float = 1.0, uid: str = "q", tool_calls: int = 1, bonus: float = 0.0) -> Trajectory:
    i = next(_ids)
    return Trajectory(
        uid=uid,
        segments=[Segment("prompt", [1, 2]), Segment("assistant", [3, 4], [-0.1, -0.2], step=0),
                  Segment("observation", [5]), Segment("assistant", [6], [-0.3], step=1)],
        outcome_reward=reward,
        rewards={"tool_bonus": bonus} if bonus else {},
        stats=make_stats(tool_calls=tool_calls),
        traj_id=f"t{i}",
    )


def add(buf, step, rewards, means=(0.0,), stds=(1.0,), adv=None, **kw):
    """Add a batch whose trajectories all have A_i = 1 (candidates) unless ``adv`` is given."""
    ts = [traj(r) for r in rewards]
    adv = [1.0] * len(ts) if adv is None else adv
    buf.add_batch(ts, adv, step, list(means), list(stds), **kw)
    return ts


def ids(items):
    return [t.traj_id for t, *_ in items]


# ---- admission ----------------------------------------------------------------------------------
def test_admission_only_positive_advantage_unfiltered():
    buf = SILReplayBuffer(capacity=4)
    ts = [traj(1.0), traj(0.0), traj(-1.0), traj(0.5, bonus=0.3), traj(2.0), traj(1.0)]
    adv = [0.5, 0.0, -0.2, 1e-9, 2.0, 1.0]
    zeroed = [False, False, False, False, True, False]
    assert buf.add_batch(ts, adv, 3, [0.1], [0.2], zeroed) == 3
    assert ids(buf.entries) == [ts[0].traj_id, ts[3].traj_id, ts[5].traj_id]
    # return as collected, tool bonus included; step recorded
    assert [(r, s) for _, r, s in buf.entries] == [(1.0, 3), (0.8, 3), (1.0, 3)]
    # stored copy: later mutation of the batch does not change the buffer
    ts[3].rewards["tool_bonus"] = 5.0
    assert buf.entries[1][0].total_reward == pytest.approx(0.8)
    assert len(buf) == 3


def test_admission_tool_call_requirement():
    ts = [traj(1.0, tool_calls=0), traj(1.0, tool_calls=1), traj(1.0, tool_calls=3)]
    buf = SILReplayBuffer(require_tool_call=True)
    buf.add_batch(ts, [1.0] * 3, 1, [0.0], [0.0])
    assert ids(buf.entries) == [ts[1].traj_id, ts[2].traj_id]
    # a trajectory without episode stats cannot be judged: an error names the knob, not a silent 0
    no_stats = Trajectory(uid="q", segments=[Segment("prompt", [1])], outcome_reward=1.0)
    with pytest.raises(ValueError, match="sil_require_tool_call"):
        SILReplayBuffer(require_tool_call=True).add_batch([no_stats], [1.0], 1, [0.0], [0.0])
    buf2 = SILReplayBuffer(require_tool_call=False)
    buf2.add_batch(ts + [no_stats], [1.0] * 4, 1, [0.0], [0.0])
    assert len(buf2) == 4


# ---- staleness ----------------------------------------------------------------------------------
def test_staleness_eviction_at_exact_boundary():
    buf = SILReplayBuffer(tolerate_steps=2)
    s1 = add(buf, 1, [1.0])
    add(buf, 2, [1.0])
    add(buf, 3, [1.0])  # step-1 entry has age 2 == tolerate: kept
    assert [s for *_, s in buf.entries] == [1, 2, 3]
    assert buf.entries[0][0].traj_id == s1[0].traj_id
    add(buf, 4, [])  # age 3 > 2: evicted, even with no new candidates
    assert [s for *_, s in buf.entries] == [2, 3]
    assert buf.metrics()["evicted_stale"] == 1
    add(buf, 10, [1.0])
    assert [s for *_, s in buf.entries] == [10]
    assert buf.metrics()["evicted_stale"] == 3


def test_staleness_zero_tolerance_and_released_reference():
    buf = SILReplayBuffer(tolerate_steps=0)
    add(buf, 1, [1.0, 1.0])
    add(buf, 2, [1.0])
    assert [s for *_, s in buf.entries] == [2]
    # released remove_old: reference is the newest stored entry's step, not t_now
    rel = SILReplayBuffer(tolerate_steps=1, staleness_reference="latest_entry")
    add(rel, 1, [1.0])
    add(rel, 5, [])  # newest stored entry is from step 1: nothing evicted
    assert [s for *_, s in rel.entries] == [1]
    add(rel, 6, [1.0])  # still 1 at eviction time; step-6 entry added after
    assert [s for *_, s in rel.entries] == [1, 6]
    add(rel, 7, [])  # reference 6: step 1 goes
    assert [s for *_, s in rel.entries] == [6]


# ---- baseline history ---------------------------------------------------------------------------
def test_baseline_history_cap_drops_oldest_whole_steps():
    buf = SILReplayBuffer(baseline_buffer_size=5)
    add(buf, 1, [], means=[0, 1], stds=[0.0, 0.1])
    add(buf, 2, [], means=[2, 3], stds=[0.2, 0.3])
    assert [h[0] for h in buf.baseline_history] == [1, 2]
    add(buf, 3, [], means=[4, 5], stds=[0.4, 0.5])  # 6 > 5: step 1 dropped whole
    assert [h[0] for h in buf.baseline_history] == [2, 3]
    assert buf.baseline() == pytest.approx((3.5, 0.35))
    add(buf, 4, [], means=[10, 11, 12], stds=[1.0, 1.1, 1.2])  # 7 > 5: drop step 2 -> 5
    assert [h[0] for h in buf.baseline_history] == [3, 4]
    assert buf.baseline() == pytest.approx((10.0, 1.0))
    assert buf.metrics()["baseline_groups"] == 5
    # the newest step is never dropped, even if alone it exceeds the cap
    add(buf, 5, [], means=[7] * 8, stds=[0.7] * 8)
    assert [h[0] for h in buf.baseline_history] == [5]


def test_baseline_history_released_trim_before_append():
    buf = SILReplayBuffer(baseline_buffer_size=5, baseline_trim="before_append")
    for t, m in [(1, [0, 1]), (2, [2, 3]), (3, [4, 5])]:
        add(buf, t, [], means=m, stds=[0.0, 0.0])
    assert [h[0] for h in buf.baseline_history] == [1, 2, 3]  # 4 <= 5 before appending
    add(buf, 4, [], means=[6, 7], stds=[0.0, 0.0])  # 6 > 5: pop step 1, then append
    assert [h[0] for h in buf.baseline_history] == [2, 3, 4]


# ---- recalibration ------------------------------------------------------------------------------
def test_p50_recalibration_odd_and_even_counts():
    buf = SILReplayBuffer()
    add(buf, 1, [2.0, 1.0, 0.5], means=[3.0, 0.0, 1.0], stds=[0.5, 0.1, 0.3])
    assert buf.baseline() == pytest.approx((1.0, 0.3))  # odd count: middle value
    assert [a for _, a in buf.recalibrated()] == pytest.approx([1.0, 0.0])  # keep >= 0
    assert buf.num_above_baseline() == 1  # R > b strictly
    add(buf, 2, [], means=[5.0], stds=[0.9])  # means 0,1,3,5 -> 2.0; stds .1,.3,.5,.9 -> 0.4
    assert buf.baseline() == pytest.approx((2.0, 0.4))
    assert [a for _, a in buf.recalibrated()] == pytest.approx([0.0])
    assert buf.num_above_baseline() == 0

    norm = SILReplayBuffer(std_normalize=True)
    add(norm, 1, [2.0, 1.0, 0.5], means=[3.0, 0.0, 1.0], stds=[0.5, 0.1, 0.3])
    assert [a for _, a in norm.recalibrated()] == pytest.approx([1.0 / (0.3 + 1e-6), 0.0])


def test_keep_zero_vs_strictly_positive():
    ts_kw = dict(means=[1.0], stds=[0.0])
    agent = SILReplayBuffer(keep_zero=True)
    math_ = SILReplayBuffer(keep_zero=False)
    for buf in (agent, math_):
        add(buf, 1, [1.5, 1.0, 0.9], **ts_kw)
    assert [a for _, a in agent.recalibrated()] == pytest.approx([0.5, 0.0])
    assert [a for _, a in math_.recalibrated()] == pytest.approx([0.5])


# ---- burst trigger and sampling ----------------------------------------------------------------
def test_burst_threshold_is_strict():
    buf = SILReplayBuffer(capacity=2, seed=0)  # threshold 1.5 * 2 = 3
    add(buf, 1, [1.0, 1.0, 1.0, 0.0, 0.0])  # b = 0: three above, two equal
    assert buf.num_above_baseline() == 3 and not buf.is_triggered()
    assert buf.sample_replay(2) == [] and len(buf) == 5  # nothing replayed, nothing cleared
    add(buf, 2, [1.0])
    assert buf.num_above_baseline() == 4 and buf.is_triggered()
    assert len(buf.sample_replay(3)) == 2


@pytest.mark.parametrize(
    "capacity, n_above, n_zero, keep_zero, expected",
    [
        (4, 7, 2, True, 4),      # kept 9 -> 8 -> capped at capacity 4
        (3, 5, 0, True, 3),      # kept 5 -> 4 -> capped at 3
        (17, 26, 0, True, 16),   # kept 26 -> 16 < capacity
        (17, 26, 6, True, 17),   # kept 32 (zeros kept) -> 32 -> capped at 17
        (17, 26, 6, False, 16),  # zeros dropped: kept 26 -> 16
    ],
)
def test_burst_sample_size_power_of_two_capped(capacity, n_above, n_zero, keep_zero, expected):
    buf = SILReplayBuffer(capacity=capacity, keep_zero=keep_zero, seed=1)
    ts = add(buf, 1, [2.0] * n_above + [0.0] * n_zero)
    out = buf.sample_replay(2)
    assert len(out) == expected
    assert len(set(ids(out))) == expected  # without replacement
    assert set(ids(out)) <= {t.traj_id for t in ts}
    for t, a in out:
        assert a == pytest.approx(t.total_reward - 0.0)
        assert a > 0 or keep_zero


def test_nearest_lower_power_of_2():
    assert [nearest_lower_power_of_2(n) for n in (0, 1, 2, 3, 4, 7, 8, 9, 2049)] == \
        [0, 1, 2, 2, 4, 4, 8, 8, 2048]


def test_clear_after_burst_keeps_history():
    buf = SILReplayBuffer(capacity=2, seed=3)
    add(buf, 1, [1.0] * 4, means=[0.0, 0.5], stds=[0.1, 0.2])
    hist = buf.baseline_history
    out = buf.sample_replay(2)
    assert len(out) == 2 and len(buf) == 0
    assert buf.baseline_history == hist
    m = buf.metrics()
    assert (m["replay_events"], m["replayed_samples"], m["cleared"], m["size"]) == (1, 2, 4, 0)
    assert buf.sample_replay(3) == []  # empty now
    assert buf.metrics()["replay_events"] == 1


def test_tiny_batch_guard_still_clears():
    buf = SILReplayBuffer(capacity=4, min_replay_size=8, seed=0)
    add(buf, 1, [1.0] * 7)  # 7 > 6: triggered, n = min(4, 4) = 4 < 8
    assert buf.sample_replay(2) == []
    assert len(buf) == 0
    m = buf.metrics()
    assert (m["replay_events"], m["suppressed_replays"]) == (0, 1)


def test_continuous_mode_samples_every_step_without_clearing():
    buf = SILReplayBuffer(capacity=100, trigger="continuous", replay_batch_size=3, seed=0)
    assert buf.sample_replay(1) == []
    add(buf, 1, [1.0, 0.5])  # far below any burst threshold
    out = buf.sample_replay(2)
    assert sorted(a for _, a in out) == pytest.approx([0.5, 1.0]) and len(buf) == 2
    add(buf, 2, [2.0, 3.0, -1.0])  # R=-1 < b: not kept by recalibration
    out = buf.sample_replay(3)
    assert len(out) == 3 and len(buf) == 5
    assert all(a >= 0 for _, a in out)
    assert buf.metrics()["replayed_samples"] == 5


# ---- scripted sequence and order of operations -------------------------------------------------
def test_scripted_sequence_order_of_operations():
    buf = SILReplayBuffer(capacity=2, tolerate_steps=1, seed=7)  # burst when > 3 above b = 0

    def step_update(step, trajs, adv, means, stds):  # SPEAR: (a) replay_rows, (b)+(c) after_update
        replay = buf.sample_replay(step)
        buf.add_batch(trajs, adv, step, means, stds)
        return replay

    s1 = [traj(1.0), traj(1.0)]
    assert step_update(1, s1, [1, 1], [0.0], [1.0]) == []
    assert step_update(2, [traj(1.0)], [1], [0.0], [1.0]) == []  # 3 above: not > 3
    assert len(buf) == 3
    s3 = [traj(1.0), traj(1.0), traj(1.0)]
    assert step_update(3, s3, [1, 1, 1], [0.0], [1.0]) == []  # sampled at 3 entries
    assert [s for *_, s in buf.entries] == [2, 3, 3, 3]  # step 1 evicted (age 2 > 1)
    s4 = [traj(1.0)]
    replay = step_update(4, s4, [1], [0.0], [1.0])  # (a) before (c): replays steps 2-3 only
    assert len(replay) == 2
    assert s4[0].traj_id not in ids(replay)
    assert ids(buf.entries) == [s4[0].traj_id]  # cleared, then step 4 added


def test_default_group_stats_by_uid():
    buf = SILReplayBuffer()
    ts = [traj(1.0, uid="a"), traj(0.0, uid="b"), traj(0.0, uid="a"), traj(4.0, uid="b")]
    buf.add_batch(ts, [0.0] * 4, 1)  # non-contiguous groups: found by uid
    _, means, stds = buf.baseline_history[-1]
    assert means == pytest.approx([0.5, 2.0])
    assert stds == pytest.approx([0.5, 2.0])  # population std (ddof=0)


# ---- checkpoint ---------------------------------------------------------------------------------
def _run_script(bufs, steps):
    """Add the same batches (same trajectory objects) to every buffer in ``bufs``."""
    for t in steps:
        ts = [traj(1.0 + 0.1 * k) for k in range(t % 4 + 2)]
        for buf in bufs:
            buf.add_batch(ts, [1.0] * len(ts), t, [0.5, 0.2 * t], [0.3, 0.1 * t])


def test_checkpoint_round_trip_reproduces_future_samples():
    buf = SILReplayBuffer(capacity=2, tolerate_steps=3, trigger="continuous",
                          replay_batch_size=3, seed=123)
    _run_script([buf], [1, 2, 3])
    buf.sample_replay(4)  # advance the RNG
    state = buf.get_state()
    state = json.loads(json.dumps(state))  # JSON-ish
    state = pickle.loads(pickle.dumps(state))
    restored = SILReplayBuffer()  # defaults; config comes from the state
    restored.set_state(state)
    assert restored.config() == buf.config()
    assert restored.metrics() == buf.metrics()
    assert restored.baseline_history == buf.baseline_history
    for t in (4, 5, 6):
        a, b = buf.sample_replay(t), restored.sample_replay(t)
        assert ids(a) == ids(b) and [x for _, x in a] == [x for _, x in b] and a
        _run_script([buf, restored], [t])
    assert [(r, s) for _, r, s in buf.entries] == [(r, s) for _, r, s in restored.entries]


def test_checkpoint_round_trip_burst_same_sample():
    buf = SILReplayBuffer(capacity=4, seed=5)
    add(buf, 1, [1.0] * 5)
    add(buf, 2, [2.0] * 4)  # 9 above > 6
    buf_state_before = buf.get_state()
    restored = SILReplayBuffer(capacity=4, seed=999)
    restored.set_state(buf.get_state())
    a, b = buf.sample_replay(3), restored.sample_replay(3)
    assert len(a) == 4 and ids(a) == ids(b)
    assert [t.to_dict() for t, _ in a] == [t.to_dict() for t, _ in b]
    # without the RNG state (fresh seed) the same entries give another draw: the check can fail
    state = buf_state_before
    state["rng"] = SILReplayBuffer(seed=999).get_state()["rng"]
    other = SILReplayBuffer()
    other.set_state(state)
    assert ids(other.sample_replay(3)) != ids(a)


def test_set_state_rejects_unknown_version():
    buf = SILReplayBuffer()
    state = buf.get_state()
    state["version"] = 99
    with pytest.raises(ValueError, match="version"):
        buf.set_state(state)


# ---- arguments ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"capacity": 0}, "capacity"),
        ({"capacity": 2.5}, "capacity"),
        ({"tolerate_steps": 11}, "tolerate_steps"),
        ({"tolerate_steps": -1}, "tolerate_steps"),
        ({"baseline_buffer_size": 0}, "baseline_buffer_size"),
        ({"trigger": "sometimes"}, "trigger"),
        ({"replay_batch_size": 0}, "replay_batch_size"),
        ({"min_replay_size": -1}, "min_replay_size"),
        ({"seed": -3}, "seed"),
        ({"staleness_reference": "now"}, "staleness_reference"),
        ({"baseline_trim": "never"}, "baseline_trim"),
    ],
)
def test_bad_constructor_args_raise(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SILReplayBuffer(**kwargs)


def test_bad_add_batch_args_raise():
    buf = SILReplayBuffer()
    ts = [traj(), traj()]
    with pytest.raises(ValueError, match="advantages"):
        buf.add_batch(ts, [1.0], 1, [0.0], [0.0])
    with pytest.raises(ValueError, match="loss_masks_zeroed"):
        buf.add_batch(ts, [1.0, 1.0], 1, [0.0], [0.0], [False])
    with pytest.raises(ValueError, match="group_stds"):
        buf.add_batch(ts, [1.0, 1.0], 1, [0.0], None)
    with pytest.raises(ValueError, match="advantages"):
        buf.add_batch(ts, [[1.0, 2.0], 1.0], 1, [0.0], [0.0])
    buf.add_batch(ts, [1.0, 1.0], 5, [0.0], [0.0])
    with pytest.raises(ValueError, match="step"):
        buf.add_batch(ts, [1.0, 1.0], 4, [0.0], [0.0])
    with pytest.raises(ValueError, match="num_items"):
        buf.sample_replay(6, num_items=0)


def test_metrics_keys_and_empty_baseline():
    m = SILReplayBuffer().metrics()
    for k in ("size", "num_above_baseline", "baseline_mean", "baseline_std", "replay_events",
              "replayed_samples", "evicted_stale"):
        assert k in m
    assert math.isnan(m["baseline_mean"]) and m["size"] == 0 and m["num_above_baseline"] == 0


def test_restored_run_keeps_its_own_buffer_config(caplog):
    """The issue's probe: a run restored with capacity 64 / continuous got the checkpoint's
    2048 / burst back. The running config wins; the entries come back; a warning names the diff."""
    from rllib_spear.algorithms.spear import SPEARConfig
    from rllib_spear.recipe.self_imitation import SelfImitation

    saved = SelfImitation(SPEARConfig().training(sil_capacity=2048, sil_trigger="burst"))
    add(saved.buffer, 1, [1.0, 2.0, 3.0])
    state = saved.get_state()
    running = SelfImitation(SPEARConfig().training(sil_capacity=64, sil_trigger="continuous"))
    with caplog.at_level("WARNING"):
        running.set_state(state)
    assert running.buffer.capacity == 64 and running.buffer.trigger == "continuous"
    assert len(running.buffer.entries) == len(saved.buffer.entries) == 3
    assert "capacity: checkpoint 2048 -> running 64" in caplog.text and "trigger" in caplog.text
