"""Mini-batches per epoch in the learner batches (``num_epochs``): a fresh seeded shuffle of the
groups each epoch, normalizers per (epoch, mini-batch)."""
from __future__ import annotations

import numpy as np
import pytest

from rllib_spear.core.trajectory import Segment, Trajectory
from rllib_spear.recipe.batching import LearnerRow, build_learner_batches, epoch_minibatch_ids


def _rows(n_groups: int = 4) -> list[LearnerRow]:
    """2 rows per group; row i has i + 1 loss tokens (hand-countable normalizers)."""
    rows = []
    for i in range(2 * n_groups):
        t = Trajectory(uid=f"g{i // 2}", segments=[Segment("prompt", [5, 6]),
                                                   Segment("assistant", [7] * (i + 1), [-1.0] * (i + 1), 0)],
                       outcome_reward=0.0, step_rewards=[0.0], traj_id=f"t{i}")
        rows.append(LearnerRow(t, t.token_advantages(1.0), t.loss_mask()))
    return rows


def test_each_epoch_is_a_fresh_shuffle_of_whole_groups():
    groups = [[0, 1], [2, 3], [4, 5], [6, 7]]
    ids, num_mb = epoch_minibatch_ids(groups, 8, 4, 3, np.random.default_rng(0))
    assert num_mb == 2 and ids.shape == (8, 3)
    # by hand: default_rng(0) permutes the 4 groups as [2, 0, 1, 3], then [3, 2, 1, 0], then
    # [1, 3, 0, 2]; the first two groups of each order (4 rows) make mini-batch 0
    rng = np.random.default_rng(0)
    assert [rng.permutation(4).tolist() for _ in range(3)] == [[2, 0, 1, 3], [3, 2, 1, 0], [1, 3, 0, 2]]
    assert ids.T.tolist() == [[0, 0, 1, 1, 0, 0, 1, 1],
                              [1, 1, 1, 1, 0, 0, 0, 0],
                              [1, 1, 0, 0, 1, 1, 0, 0]]
    # every epoch: both rows of a group in one mini-batch, 4 rows per mini-batch
    for e in range(3):
        assert all(ids[a, e] == ids[b, e] for a, b in groups)
        assert np.bincount(ids[:, e]).tolist() == [4, 4]


def test_epoch_zero_is_the_single_epoch_shuffle():
    rows = _rows()
    (one,) = build_learner_batches(rows, num_learners=0, minibatch_size=4, t_norm=8.0, pad_token_id=0, seed=3)
    (three,) = build_learner_batches(rows, num_learners=0, minibatch_size=4, t_norm=8.0, pad_token_id=0, seed=3,
                                     num_epochs=3)
    assert one["minibatch_id"].shape == (8, 1) and three["minibatch_id"].shape == (8, 3)
    np.testing.assert_array_equal(three["minibatch_id"][:, :1], one["minibatch_id"])
    np.testing.assert_array_equal(three["norm_num_tokens"][:, :1], one["norm_num_tokens"])
    for k in ("input_ids", "loss_mask", "old_logp", "advantages"):  # the rows themselves: once
        np.testing.assert_array_equal(three[k], one[k])
    assert int(three["num_minibatches"][0]) == 2


def test_normalizers_are_those_of_each_epochs_mini_batch():
    (b,) = build_learner_batches(_rows(), num_learners=0, minibatch_size=4, t_norm=8.0, pad_token_id=0, seed=0,
                                 num_epochs=3)
    tokens = b["loss_mask"].sum(1)  # row i: i + 1 loss tokens (the row order is the batch's)
    for e in range(3):
        for mb in (0, 1):
            rows = b["minibatch_id"][:, e] == mb
            assert np.all(b["norm_num_tokens"][rows, e] == tokens[rows].sum())
            assert np.all(b["norm_num_seqs"][rows, e] == 4)
    # whole batch, 3 epochs: one mini-batch each, the batch's 36 tokens
    (w,) = build_learner_batches(_rows(), num_learners=0, minibatch_size=None, t_norm=8.0, pad_token_id=0,
                                 num_epochs=3)
    assert np.all(w["minibatch_id"] == 0) and np.all(w["norm_num_tokens"] == 36) and np.all(w["norm_num_seqs"] == 8)


def test_learners_share_the_epochs_mini_batches():
    batches = build_learner_batches(_rows(), num_learners=2, minibatch_size=4, t_norm=8.0, pad_token_id=0,
                                    num_epochs=2)
    assert [b["minibatch_id"].shape[1] for b in batches] == [2, 2]
    assert {int(b["num_minibatches"][0]) for b in batches} == {2}  # the same steps on every learner


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_num_epochs_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match="num_epochs"):
        build_learner_batches(_rows(), num_learners=0, minibatch_size=None, t_norm=8.0, pad_token_id=0,
                              num_epochs=bad)
