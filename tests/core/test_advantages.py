"""Hand-computed checks of rllib_spear.core.advantages (docs/algorithms.md 1.1, 3.3)."""
import math

import numpy as np
import pytest

from rllib_spear.core.advantages import (
    broadcast_step_advantages,
    discounted_step_returns,
    group_advantages,
    group_reward_stats,
    step_peer_advantages,
)
from rllib_spear.core.trajectory import Segment, Trajectory

EPS = 1e-6


# ---- group_advantages ------------------------------------------------------------------------
def test_grpo_unbiased_std_and_singleton():
    # group a = [1, 2, 3]: mean 2, unbiased std sqrt((1 + 0 + 1) / 2) = 1 -> (R - 2) / (1 + 1e-6)
    # group b = [5] (size 1): mean 0, std 1 -> 5 / (1 + 1e-6)
    adv = group_advantages([1.0, 2.0, 3.0, 5.0], ["a", "a", "a", "b"], std_normalize=True)
    expected = np.array([-1.0, 0.0, 1.0, 5.0]) / (1.0 + EPS)
    np.testing.assert_allclose(adv, expected, rtol=0, atol=1e-12)


def test_grpo_uses_unbiased_not_population_std():
    # [0, 2]: mean 1, unbiased std sqrt(2) (population std would be 1) -> A = -+1/sqrt(2)
    adv = group_advantages([0.0, 2.0], [7, 7], std_normalize=True)
    np.testing.assert_allclose(adv, [-1 / (math.sqrt(2) + EPS), 1 / (math.sqrt(2) + EPS)], atol=1e-12)


def test_dr_grpo_no_std_division():
    # a: mean 2 -> [-1, 0, 1]; singleton b: mean 0 -> 5
    adv = group_advantages([1.0, 2.0, 3.0, 5.0], ["a", "a", "a", "b"], std_normalize=False)
    np.testing.assert_allclose(adv, [-1.0, 0.0, 1.0, 5.0], atol=1e-12)


def test_groups_by_uid_not_position():
    # interleaved: a = [1, 3] (mean 2), b = [10, 20] (mean 15)
    adv = group_advantages([1.0, 10.0, 3.0, 20.0], ["a", "b", "a", "b"], std_normalize=False)
    np.testing.assert_allclose(adv, [-1.0, -5.0, 1.0, 5.0])
    # a permutation of the batch permutes the advantages identically
    perm = [3, 0, 2, 1]
    adv_p = group_advantages(np.array([1.0, 10.0, 3.0, 20.0])[perm], np.array(["a", "b", "a", "b"])[perm],
                             std_normalize=True)
    adv_full = group_advantages([1.0, 10.0, 3.0, 20.0], ["a", "b", "a", "b"], std_normalize=True)
    np.testing.assert_allclose(adv_p, adv_full[perm])


def test_all_equal_rewards_give_zero():
    for std in (True, False):
        np.testing.assert_array_equal(group_advantages([2.0, 2.0, 2.0], [0, 0, 0], std_normalize=std), 0.0)


def test_tuple_uids_are_fine():
    adv = group_advantages([1.0, 3.0], [("q", 1), ("q", 1)], std_normalize=False)
    np.testing.assert_allclose(adv, [-1.0, 1.0])


@pytest.mark.parametrize(
    "rewards, uids, match",
    [
        ([1.0, 2.0], ["a"], "uids"),
        ([], [], "rewards is empty"),
        ([1.0, float("nan")], ["a", "a"], "finite"),
        ([[1.0], [2.0]], ["a", "a"], "1-D"),
        ([1.0, 2.0], [["x"], ["x"]], "hashable"),
    ],
)
def test_group_advantages_bad_input(rewards, uids, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(rewards, uids, std_normalize=True)


def test_group_advantages_negative_eps():
    with pytest.raises(ValueError, match="eps"):
        group_advantages([1.0], ["a"], std_normalize=True, eps=-1.0)


# ---- group_reward_stats ----------------------------------------------------------------------
def test_group_reward_stats_population_default():
    # a = [1, 2, 3]: mean 2, population std sqrt(2/3) = 0.816496..; b = [5]: (5, 0)
    stats = group_reward_stats([1.0, 5.0, 2.0, 3.0], ["a", "b", "a", "a"])
    assert list(stats) == ["a", "b"]  # first-appearance order
    assert stats["a"][0] == pytest.approx(2.0)
    assert stats["a"][1] == pytest.approx(math.sqrt(2 / 3))
    assert stats["b"] == (5.0, 0.0)


def test_group_reward_stats_unbiased_option():
    stats = group_reward_stats([1.0, 2.0, 3.0], ["a"] * 3, ddof=1)
    assert stats["a"] == pytest.approx((2.0, 1.0))
    with pytest.raises(ValueError, match="ddof"):
        group_reward_stats([1.0], ["a"], ddof=1)
    with pytest.raises(ValueError, match="ddof"):
        group_reward_stats([1.0], ["a"], ddof=2)


# ---- discounted_step_returns -----------------------------------------------------------------
def test_discounted_returns_hand():
    # gamma 0.5, r = [1, 0, 2]: G2 = 2, G1 = 0 + 0.5*2 = 1, G0 = 1 + 0.5*1 = 1.5
    np.testing.assert_allclose(discounted_step_returns([1.0, 0.0, 2.0], 0.5), [1.5, 1.0, 2.0])
    # gamma 0.9, r = [0, 0, 1]: [0.81, 0.9, 1]
    np.testing.assert_allclose(discounted_step_returns([0, 0, 1], 0.9), [0.81, 0.9, 1.0])
    assert discounted_step_returns([], 0.9).shape == (0,)


def test_discounted_returns_bad_gamma():
    with pytest.raises(ValueError, match="gamma"):
        discounted_step_returns([1.0], 1.5)
    with pytest.raises(ValueError, match="step_rewards"):
        discounted_step_returns([[1.0]], 0.9)


# ---- step_peer_advantages --------------------------------------------------------------------
def test_spa_padded_steps_count_as_zero_population_variance():
    # gamma 0.5. X: r = [1, 2] -> G = [1 + 0.5*2, 2] = [2, 2]. Y: r = [3] -> G = [3], padded [3, 0].
    # step 0: values [2, 3], mean 2.5, population var 0.25 -> A = -+0.5 / sqrt(0.25 + 1e-6) ~ -+1
    #   (unbiased var 0.5 would give -+0.707)
    # step 1: values [2, 0 (padded)], mean 1, var 1 -> A_X1 = 1 / sqrt(1 + 1e-6)
    #   (if padding were ignored, X would be alone and get 0)
    adv = step_peer_advantages([[1.0, 2.0], [3.0]], ["g", "g"], gamma=0.5)
    assert [a.shape for a in adv] == [(2,), (1,)]
    s0 = 0.5 / math.sqrt(0.25 + EPS)
    np.testing.assert_allclose(adv[0], [-s0, 1.0 / math.sqrt(1.0 + EPS)], atol=1e-12)
    np.testing.assert_allclose(adv[1], [s0], atol=1e-12)


def test_spa_worked_example_from_notes():
    # docs/algorithms.md 3.3, worked example: A = [0.385, 0.5], B = [0.385, 1.25, 0.6],
    # C = [0.385, 1.25, 0.8]
    # gamma 0.9 -> step 0 advantages about -1.41, +0.57, +0.84; step 2: B +0.39, C +0.98
    adv = step_peer_advantages([[0.385, 0.5], [0.385, 1.25, 0.6], [0.385, 1.25, 0.8]], [1, 1, 1])
    assert [round(a[0], 2) for a in adv] == [-1.41, 0.57, 0.84]
    assert round(adv[1][2], 2) == 0.39 and round(adv[2][2], 2) == 0.98
    # step 2 by hand: G = [0 (A padded), 0.6, 0.8], mean 0.4667, pop var = (0.2178+0.0178+0.1111)/3
    g = np.array([0.0, 0.6, 0.8])
    np.testing.assert_allclose(adv[2][2], (0.8 - g.mean()) / math.sqrt(g.var() + EPS))


def test_spa_group_of_one_and_equal_returns_and_empty_trajectory():
    adv = step_peer_advantages([[1.0, 2.0], [1.0], [1.0], [5.0], []], ["s", "e", "e", "z", "z"])
    np.testing.assert_array_equal(adv[0], [0.0, 0.0])  # size-1 group
    np.testing.assert_array_equal(adv[1], [0.0])  # equal returns
    np.testing.assert_array_equal(adv[2], [0.0])
    # z: step 0 values [5, 0 (empty trajectory)], mean 2.5, var 6.25 -> 2.5 / sqrt(6.25 + 1e-6)
    np.testing.assert_allclose(adv[3], [2.5 / math.sqrt(6.25 + EPS)])
    assert adv[4].shape == (0,)


def test_spa_groups_independent():
    a1 = step_peer_advantages([[1.0], [0.0]], ["a", "a"])
    a2 = step_peer_advantages([[1.0], [100.0], [0.0], [7.0]], ["a", "b", "a", "b"])
    np.testing.assert_allclose(a2[0], a1[0])
    np.testing.assert_allclose(a2[2], a1[1])


def test_spa_bad_input():
    with pytest.raises(ValueError, match="step_rewards is empty"):
        step_peer_advantages([], [])
    with pytest.raises(ValueError, match="uids"):
        step_peer_advantages([[1.0]], ["a", "b"])
    with pytest.raises(ValueError, match="gamma"):
        step_peer_advantages([[1.0]], ["a"], gamma=-0.1)


# ---- broadcast_step_advantages ---------------------------------------------------------------
def test_broadcast_hand():
    steps = np.array([-1, -1, 0, 0, -1, 1, 1, -1, 2])
    out = broadcast_step_advantages(steps, [0.5, -1.0])
    # step 2 is beyond the 2 given advantages -> 0; -1 (prompt/observation) -> 0
    np.testing.assert_array_equal(out, np.array([0, 0, 0.5, 0.5, 0, -1, -1, 0, 0], np.float32))
    assert out.dtype == np.float32


def test_broadcast_2d_and_empty():
    steps = np.array([[0, 1, -1], [-1, -1, -1]])
    np.testing.assert_array_equal(broadcast_step_advantages(steps, [2.0, 3.0]), [[2, 3, 0], [0, 0, 0]])
    np.testing.assert_array_equal(broadcast_step_advantages(np.array([0, 1]), []), [0.0, 0.0])
    assert broadcast_step_advantages(np.zeros(0, np.int64), [1.0]).shape == (0,)


def test_broadcast_matches_trajectory_token_advantages():
    traj = Trajectory(uid="u", segments=[
        Segment("prompt", [1, 2]),
        Segment("assistant", [3, 4], [-0.1, -0.2], step=0),
        Segment("observation", [5]),
        Segment("assistant", [6], [-0.3], step=1),
    ])
    np.testing.assert_array_equal(
        broadcast_step_advantages(traj.token_steps(), [1.5, -2.0]), traj.token_advantages([1.5, -2.0])
    )


def test_broadcast_bad_input():
    with pytest.raises(ValueError, match="token_steps"):
        broadcast_step_advantages(np.array([0.5]), [1.0])
    with pytest.raises(ValueError, match="step_advantages"):
        broadcast_step_advantages(np.array([0]), [[1.0]])
