"""Window-layout episodes (``Trajectory.step_prompts``) become one learner sample per step
(core/step_samples.py) at the learner-row boundary (recipe/batching.build_learner_batches)."""
from __future__ import annotations

import numpy as np
import pytest

from rllib_spear.core.step_samples import sample_lengths, step_samples
from rllib_spear.core.trajectory import Segment, Trajectory
from rllib_spear.recipe.batching import LearnerRow, build_learner_batches, expand_step_rows


def _window(uid="u", traj_id="ep", prompts=((90, 91, 92), (93, 94, 95, 96))):
    """prompt [1, 2] | a0 [10, 11] | o0 [20, 21, 22] | a1 [12, 13, 14]: full length 10."""
    segs = [Segment("prompt", [1, 2]), Segment("assistant", [10, 11], [-0.1, -0.2], step=0),
            Segment("observation", [20, 21, 22], step=0), Segment("assistant", [12, 13, 14], [-0.3, -0.4, -0.5], step=1)]
    return Trajectory(uid=uid, segments=segs, outcome_reward=1.5, step_rewards=[0.25, -0.5], traj_id=traj_id,
                      task={"q": 1}, derived={"x": 7}, step_prompts=[list(p) for p in prompts])


def test_hand_computed_slices():
    t = _window()
    assert t.layout == "window" and t.length == 10
    adv = np.arange(10, dtype=np.float32)  # position t holds t
    mask = np.array([0, 0, 1, 1, 0, 0, 0, 1, 0, 1], np.float32)  # e.g. a filter zeroed token 8
    old = -np.arange(10, dtype=np.float32) / 10
    (s0, a0, m0, l0), (s1, a1, m1, l1) = step_samples(t, adv, mask, old)
    # sample 0: window prompt [90, 91, 92] + a0 (full positions 2..3)
    assert list(s0.input_ids()) == [90, 91, 92, 10, 11]
    assert a0.tolist() == [0, 0, 0, 2, 3] and m0.tolist() == [0, 0, 0, 1, 1]
    assert np.allclose(l0, [0, 0, 0, -0.2, -0.3])
    # sample 1: window prompt [93..96] + a1 (full positions 7..9)
    assert list(s1.input_ids()) == [93, 94, 95, 96, 12, 13, 14]
    assert a1.tolist() == [0, 0, 0, 0, 7, 8, 9] and m1.tolist() == [0, 0, 0, 0, 1, 0, 1]
    assert np.allclose(l1, [0, 0, 0, 0, -0.7, -0.8, -0.9])
    for k, s in enumerate((s0, s1)):
        assert s.uid == "u" and s.traj_id == f"ep:{k}" and s.layout == "full"
        assert s.derived == {"x": 7, "episode_id": "ep", "step": k}
        assert s.outcome_reward == 1.5 and s.task == {"q": 1} and s.step_rewards == [[0.25, -0.5][k]]
        assert [seg.kind for seg in s.segments] == ["prompt", "assistant"]
    assert t.derived == {"x": 7}  # the episode is not changed
    assert s0.behaviour_logprobs().tolist() == pytest.approx([0, 0, 0, -0.1, -0.2])
    assert step_samples(t, adv, mask)[0][3] is None
    assert sample_lengths([t]) == [5, 7]


def test_bad_arrays_and_prompts_are_refused():
    t = _window()
    with pytest.raises(ValueError, match=r"advantages has shape \(9,\)"):
        step_samples(t, np.zeros(9), np.zeros(10))
    with pytest.raises(ValueError, match="1 prompts for 2 steps"):
        _window(prompts=((1,),))


def test_serialisation_keeps_the_layout_and_reads_older_dicts():
    t = _window()
    back = Trajectory.from_dict(t.to_dict())
    assert back.step_prompts == t.step_prompts and back.layout == "window"
    d = t.to_dict()
    del d["step_prompts"]  # a checkpoint written before the window layout
    assert Trajectory.from_dict(d).step_prompts is None
    full = Trajectory(uid="f", segments=[Segment("prompt", [1])])
    assert "step_prompts" not in full.to_dict() and Trajectory.from_dict(full.to_dict()).layout == "full"


def test_build_learner_batches_trains_one_row_per_step():
    w1, w2 = _window("a", "e1"), _window("a", "e2", prompts=((5,), (6, 7)))
    full = Trajectory(uid="b", segments=[Segment("prompt", [1, 2, 3]), Segment("assistant", [4, 5], [-1.0, -1.0], step=0)],
                      traj_id="f")
    rows = [LearnerRow(w1, np.full(10, 2.0, np.float32), w1.loss_mask()),
            LearnerRow(w2, np.full(10, -1.0, np.float32), w2.loss_mask() * 0),  # filtered: every sample masked
            LearnerRow(full, np.ones(5, np.float32), full.loss_mask(), is_replay=True, loss_weight=0.5,
                       old_logp=np.full(5, -2.0, np.float32))]
    expanded = expand_step_rows(rows)
    assert [r.traj.traj_id for r in expanded] == ["e1:0", "e1:1", "e2:0", "e2:1", "f"]
    assert [r.is_replay for r in expanded] == [False] * 4 + [True] and expanded[-1] is rows[-1]
    (b,) = build_learner_batches(rows, num_learners=1, minibatch_size=None, t_norm=4.0, pad_token_id=0)
    ids = [list(r[r > 0]) for r in b["input_ids"]]  # (no id 0 in these trajectories)
    assert sorted(map(tuple, ids)) == sorted([(90, 91, 92, 10, 11), (93, 94, 95, 96, 12, 13, 14), (5, 10, 11),
                                              (6, 7, 12, 13, 14), (1, 2, 3, 4, 5)])
    assert b["input_ids"].shape == (5, 7)
    by = {tuple(i): k for k, i in enumerate(ids)}
    k = by[(93, 94, 95, 96, 12, 13, 14)]
    assert b["loss_mask"][k].tolist() == [0, 0, 0, 0, 1, 1, 1] and b["advantages"][k].tolist() == [0] * 4 + [2] * 3
    assert np.allclose(b["old_logp"][k], [0, 0, 0, 0, -0.3, -0.4, -0.5])
    assert b["loss_mask"][by[(6, 7, 12, 13, 14)]].sum() == 0
    f = by[(1, 2, 3, 4, 5)]
    assert b["is_replay"][f] == 1 and b["loss_weight"][f] == 0.5 and np.allclose(b["old_logp"][f], [0, 0, 0, -2, -2, 0, 0])
    # normalizers count step samples: 2 non-empty on-policy sequences (e2's are masked), 5 tokens
    on = [i for i in range(5) if b["is_replay"][i] == 0]
    assert set(b["norm_num_tokens"][on, 0]) == {5.0}
    assert set(b["norm_num_seqs"][on, 0]) == {2.0}


def test_minibatches_count_samples_and_keep_an_episode_group_together():
    trajs = [_window(uid=f"g{g}", traj_id=f"g{g}e{e}") for g in range(3) for e in range(2)]
    rows = [LearnerRow(t, np.ones(10, np.float32), t.loss_mask()) for t in trajs]
    (b,) = build_learner_batches(rows, num_learners=1, minibatch_size=4, t_norm=4.0, pad_token_id=0, seed=3)
    assert len(b["input_ids"]) == 12 and int(b["num_minibatches"][0]) == 3  # 12 step samples / 4
    two = build_learner_batches(rows, num_learners=2, minibatch_size=None, t_norm=4.0, pad_token_id=0)
    assert sorted(len(x["input_ids"]) for x in two) == [4, 8]  # whole groups (uid) per learner: 4 samples each
