"""Hand-computed checks of GiGPO (docs/algorithms.md 3.5): rllib_spear.core.advantages
(gigpo_step_advantages, gigpo_advantages) and the ``gigpo`` estimator of rllib_spear.recipe.

Rewards are binary fractions (0.5, 2, 4, ...) where possible, so most expectations are exact."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from rllib_spear.core.advantages import gigpo_advantages, gigpo_step_advantages, group_advantages
from rllib_spear.core.trajectory import Segment, Trajectory
from rllib_spear.recipe import ADVANTAGE_ESTIMATORS
from rllib_spear.recipe.estimators import gigpo_anchors

EPS = 1e-6
P = [1, 2, 3]  # the prompt's token ids: the anchor state of step 0


def _traj(uid: str, observations: list[list[int] | None], step_rewards: list[float], outcome: float = 0.0,
          traj_id: str = "") -> Trajectory:
    """Prompt P, then assistant turn k (tokens [100 + k, 200 + k]) followed by ``observations[k]``
    (len = steps - 1; None = no observation segment between turn k and turn k + 1)."""
    segs = [Segment("prompt", list(P))]
    for k in range(len(observations) + 1):
        segs.append(Segment("assistant", [100 + k, 200 + k], logprobs=[-0.5, -0.5], step=k))
        if k < len(observations) and observations[k] is not None:
            segs.append(Segment("observation", list(observations[k]), step=k))
    return Trajectory(uid=uid, segments=segs, outcome_reward=outcome, step_rewards=list(step_rewards),
                      traj_id=traj_id or f"{uid}-{len(segs)}-{outcome}")


def _cfg(gamma: float = 0.5, weight: float = 1.0, mode: str = "mean_norm") -> SimpleNamespace:
    return SimpleNamespace(gigpo_gamma=gamma, gigpo_step_weight=weight, gigpo_mode=mode)


def _gigpo(trajs, cfg):
    return ADVANTAGE_ESTIMATORS.get("gigpo")(trajs, cfg)


def _abc():
    """One task q, gamma 0.5. The outcome is paid on the last step (step_rewards_with_outcome).

    A: P -a0-> [7] -a1-> end; step rewards [0.5, 0], outcome 1 -> r = [0.5, 1],   R = 1.5
       G1 = 1, G0 = 0.5 + 0.5 * 1 = 1.0                      anchors [P, (7,)]
    B: P -b0-> [8] -b1-> [7] -b2-> end; outcome 2           -> r = [0, 0, 2],  R = 2
       G2 = 2, G1 = 0 + 0.5 * 2 = 1, G0 = 0 + 0.5 * 1 = 0.5  anchors [P, (8,), (7,)]
    C: P -c0-> [7] -c1-> end; nothing                       -> r = [0, 0],     R = 0
       G = [0, 0]                                            anchors [P, (7,)]
    """
    return [_traj("q", [[7]], [0.5, 0.0], outcome=1.0, traj_id="A"),
            _traj("q", [[8], [7]], [0.0, 0.0, 0.0], outcome=2.0, traj_id="B"),
            _traj("q", [[7]], [0.0, 0.0], outcome=0.0, traj_id="C")]


# ---- anchors ---------------------------------------------------------------------------------
def test_anchors_are_prompt_then_the_observation_before_each_turn():
    a, b, _ = _abc()
    assert gigpo_anchors(a, 2) == [(1, 2, 3), (7,)]
    assert gigpo_anchors(b, 3) == [(1, 2, 3), (8,), (7,)]
    # turn 1 follows turn 0 with no observation in between: no known state -> None
    gap = _traj("q", [None, [9]], [0.0, 0.0, 0.0])
    assert gigpo_anchors(gap, 3) == [(1, 2, 3), None, (9,)]
    # more step entries than assistant turns (a 0-turn trajectory has one entry): None
    assert gigpo_anchors(a, 3) == [(1, 2, 3), (7,), None]


# ---- repeated anchor states across trajectories; both modes; omega ----------------------------
def test_repeated_anchors_across_trajectories_mean_norm():
    # Episode (mean_norm): R = [1.5, 2, 0], mean 7/6 -> A_ep = [1/3, 5/6, -7/6]
    # Step groups (by anchor, across step indices):
    #   P   : A0 = 1.0, B0 = 0.5, C0 = 0   mean 0.5 -> A0 +0.5, B0 0, C0 -0.5
    #   (7,): A1 = 1.0, B2 = 2.0, C1 = 0   mean 1.0 -> A1 0, B2 +1, C1 -1
    #   (8,): B1 = 1.0 alone              singleton -> 0
    # A_k = A_ep + 1 * A_st:
    #   A = [1/3 + 0.5, 1/3 + 0]             = [5/6, 1/3]
    #   B = [5/6 + 0, 5/6 + 0, 5/6 + 1]      = [5/6, 5/6, 11/6]
    #   C = [-7/6 - 0.5, -7/6 - 1]           = [-5/3, -13/6]
    trajs = _abc()
    adv = _gigpo(trajs, _cfg(gamma=0.5, weight=1.0, mode="mean_norm"))
    expected = [[5 / 6, 1 / 3], [5 / 6, 5 / 6, 11 / 6], [-5 / 3, -13 / 6]]
    for t, e in zip(trajs, expected):
        np.testing.assert_allclose(t.derived["step_advantages"], e, rtol=0, atol=1e-12)
    # the SIL episode advantage is R_i - mean_g R whatever the mode
    np.testing.assert_allclose(adv.episode, [1 / 3, 5 / 6, -7 / 6], atol=1e-12)
    # tokens: A_k on both tokens of assistant turn k; prompt and observation tokens 0
    # A's layout: P P P | a0 a0 | 7 | a1 a1
    np.testing.assert_allclose(adv.token[0], np.array([0, 0, 0, 5 / 6, 5 / 6, 0, 1 / 3, 1 / 3], np.float32))
    # the pure function gives the same numbers from plain lists
    pure = gigpo_advantages([1.5, 2.0, 0.0], [[0.5, 1.0], [0.0, 0.0, 2.0], [0.0, 0.0]],
                            [[P[0], 7], [P[0], 8, 7], [P[0], 7]], ["q"] * 3, gamma=0.5, step_weight=1.0,
                            mode="mean_norm")
    for p, e in zip(pure, expected):
        np.testing.assert_allclose(p, e, atol=1e-12)


def test_repeated_anchors_across_trajectories_mean_std_norm_and_omega():
    # Episode: deviations [1/3, 5/6, -7/6]; squares 4/36 + 25/36 + 49/36 = 13/6; / (3 - 1) = 13/12
    #   -> A_ep = dev / (sqrt(13/12) + eps)
    # Step P:    [1, 0.5, 0]: dev [0.5, 0, -0.5], var 0.5 / 2 = 0.25, std 0.5 -> [0.5, 0, -0.5] / (0.5 + eps)
    # Step (7,): [1, 2, 0]:   dev [0, 1, -1],     var 2 / 2 = 1,     std 1   -> [0, 1, -1] / (1 + eps)
    # Step (8,): singleton -> 0.    omega = 0.5.
    s_ep = math.sqrt(13 / 12) + EPS
    ep = np.array([1 / 3, 5 / 6, -7 / 6]) / s_ep
    p = 0.5 / (0.5 + EPS)
    o = 1 / (1 + EPS)
    expected = [[ep[0] + 0.5 * p, ep[0] + 0.5 * 0],
                [ep[1] + 0.5 * 0, ep[1] + 0.5 * 0, ep[1] + 0.5 * o],
                [ep[2] - 0.5 * p, ep[2] - 0.5 * o]]
    trajs = _abc()
    adv = _gigpo(trajs, _cfg(gamma=0.5, weight=0.5, mode="mean_std_norm"))
    for t, e in zip(trajs, expected):
        np.testing.assert_allclose(t.derived["step_advantages"], e, rtol=0, atol=1e-12)
    np.testing.assert_allclose(adv.episode, [1 / 3, 5 / 6, -7 / 6], atol=1e-12)  # no std here


def test_omega_scales_only_the_step_part():
    # A_k = A_ep + omega * A_st: omega 0 leaves the episode advantage on every step, and the step
    # part grows linearly: adv(2) - adv(0) == 2 * (adv(1) - adv(0)).
    def run(w):
        trajs = _abc()
        _gigpo(trajs, _cfg(weight=w, mode="mean_norm"))
        return [np.array(t.derived["step_advantages"]) for t in trajs]

    a0, a1, a2 = run(0.0), run(1.0), run(2.0)
    for a, ep in zip(a0, [1 / 3, 5 / 6, -7 / 6]):
        np.testing.assert_allclose(a, ep, atol=1e-12)
    for x0, x1, x2 in zip(a0, a1, a2):
        np.testing.assert_allclose(x2 - x0, 2 * (x1 - x0), atol=1e-12)
    # the step part at omega 1 (from the hand computation above): A [+0.5, 0], B [0, 0, +1], C [-0.5, -1]
    for x0, x1, st in zip(a0, a1, [[0.5, 0], [0, 0, 1], [-0.5, -1]]):
        np.testing.assert_allclose(x1 - x0, st, atol=1e-12)


# ---- a state revisited within one trajectory; singleton groups --------------------------------
def test_state_revisited_within_one_trajectory():
    # gamma 0.5, task r.
    # X: P -x0-> [5] -x1-> [5] -x2-> end (x1 led back to the same state); step rewards [0, -1, 0],
    #    outcome 4 -> r = [0, -1, 4], R = 3; G2 = 4, G1 = -1 + 0.5 * 4 = 1, G0 = 0 + 0.5 * 1 = 0.5
    # Y: P -y0-> [5] -y1-> end; nothing -> r = [0, 0], R = 0; G = [0, 0]
    # Episode (mean_norm): mean 1.5 -> X +1.5, Y -1.5
    # Step P:    X0 0.5, Y0 0             mean 0.25 -> X0 +0.25, Y0 -0.25
    # Step (5,): X1 1, X2 4, Y1 0         mean 5/3  -> X1 -2/3, X2 +7/3, Y1 -5/3
    # X = [1.5 + 0.25, 1.5 - 2/3, 1.5 + 7/3] = [1.75, 5/6, 23/6];  Y = [-1.75, -1.5 - 5/3] = [-1.75, -19/6]
    x = _traj("r", [[5], [5]], [0.0, -1.0, 0.0], outcome=4.0, traj_id="X")
    y = _traj("r", [[5]], [0.0, 0.0], traj_id="Y")
    _gigpo([x, y], _cfg(gamma=0.5, mode="mean_norm"))
    np.testing.assert_allclose(x.derived["step_advantages"], [1.75, 5 / 6, 23 / 6], atol=1e-12)
    np.testing.assert_allclose(y.derived["step_advantages"], [-1.75, -19 / 6], atol=1e-12)


def test_singleton_episode_group_keeps_its_score_and_singleton_step_group_is_zero():
    # X alone in its task: the episode group is a singleton -> mean 0, std 1: A_ep = R = 3
    #   (mean_norm) or 3 / (1 + eps) (mean_std_norm).
    # Step P: X0 alone -> 0. Step (5,): X1 = 1, X2 = 4 (the revisit): mean 2.5 -> -1.5, +1.5;
    #   mean_std_norm: unbiased var (1.5^2 + 1.5^2) / 1 = 4.5 -> -+1.5 / (sqrt(4.5) + eps)
    x = _traj("solo", [[5], [5]], [0.0, -1.0, 0.0], outcome=4.0)
    _gigpo([x], _cfg(gamma=0.5, mode="mean_norm"))
    np.testing.assert_allclose(x.derived["step_advantages"], [3.0, 3.0 - 1.5, 3.0 + 1.5], atol=1e-12)
    _gigpo([x], _cfg(gamma=0.5, mode="mean_std_norm"))
    ep, st = 3 / (1 + EPS), 1.5 / (math.sqrt(4.5) + EPS)
    np.testing.assert_allclose(x.derived["step_advantages"], [ep, ep - st, ep + st], atol=1e-12)
    # a step with no known state (no observation before it) is a group of its own: 0
    #   Z1, Z2: P -z0-> (no observation) -z1-> end, outcome 0 / 2 -> r = [0, 0] / [0, 2], R 0 / 2
    #   Episode: mean 1 -> -1, +1. Step P: G0 = [0, 0.5 * 2 = 1] mean 0.5 -> -0.5, +0.5.
    #   Step 1: anchors None -> 0 (equal "states" are not grouped when the state is unknown).
    z1, z2 = _traj("z", [None], [0.0, 0.0]), _traj("z", [None], [0.0, 0.0], outcome=2.0)
    _gigpo([z1, z2], _cfg(gamma=0.5, mode="mean_norm"))
    np.testing.assert_allclose(z1.derived["step_advantages"], [-1.5, -1.0], atol=1e-12)
    np.testing.assert_allclose(z2.derived["step_advantages"], [1.5, 1.0], atol=1e-12)


# ---- all-equal groups: exactly 0 ------------------------------------------------------------
@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
def test_all_equal_group_gives_exactly_zero(mode):
    # Three identical rollouts with rewards 0.1 (not a binary fraction). The float mean of
    # [0.1] * 3 is 0.1 + 1.4e-17; float32 (released) is worse; with mean_std_norm that residue
    # would be divided by 0 + 1e-6. Here every advantage is exactly 0.
    assert float(np.mean([0.1] * 3)) != 0.1  # the trap
    trajs = [_traj("e", [[4]], [0.1, 0.1], outcome=0.7) for _ in range(3)]
    adv = _gigpo(trajs, _cfg(gamma=0.95, mode=mode))
    for t, a in zip(trajs, adv.token):
        assert t.derived["step_advantages"] == [0.0, 0.0]
        np.testing.assert_array_equal(a, 0.0)
    np.testing.assert_array_equal(adv.episode, 0.0)
    np.testing.assert_array_equal(group_advantages([0.1] * 3, [0] * 3, std_normalize=mode == "mean_std_norm"), 0.0)
    for a in gigpo_step_advantages([[0.1, 0.7], [0.1, 0.7], [0.7]], [["s", "t"], ["s", "t"], ["t"]], ["e"] * 3,
                                   mode=mode):
        np.testing.assert_array_equal(a, 0.0)


# ---- uids, order -----------------------------------------------------------------------------
def test_two_uids_never_share_a_step_group():
    # equal anchors "s", returns 1 and 3: one task -> mean 2 -> -1, +1; two tasks -> two singletons -> 0
    same = gigpo_step_advantages([[1.0], [3.0]], [["s"], ["s"]], ["a", "a"], mode="mean_norm")
    apart = gigpo_step_advantages([[1.0], [3.0]], [["s"], ["s"]], ["a", "b"], mode="mean_norm")
    np.testing.assert_array_equal(np.concatenate(same), [-1.0, 1.0])
    np.testing.assert_array_equal(np.concatenate(apart), [0.0, 0.0])
    # through the estimator: A (task q) and C (task q2) have identical prompts and anchors, but
    # each is alone in its task: A_ep = R (singleton), A_st = 0 -> A = [1.5, 1.5], C = [0, 0]
    a, _, c = _abc()
    c.uid = "q2"
    _gigpo([a, c], _cfg(mode="mean_norm"))
    assert a.derived["step_advantages"] == [1.5, 1.5] and c.derived["step_advantages"] == [0.0, 0.0]


@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
def test_order_invariance(mode):
    def batch():
        a, b, c = _abc()
        return [a, b, c,
                _traj("r", [[5], [5]], [0.0, -1.0, 0.0], outcome=4.0, traj_id="X"),
                _traj("r", [[5]], [0.1, 0.3], outcome=0.7, traj_id="Y"),
                _traj("r", [[6], [5]], [0.2, 0.0, 0.1], outcome=0.3, traj_id="W"),
                _traj("solo", [[5]], [0.0, 0.0], outcome=1.0, traj_id="S")]

    cfg = _cfg(gamma=0.95, weight=1.0, mode=mode)
    ref_trajs = batch()
    ref = _gigpo(ref_trajs, cfg)
    for seed in range(3):
        perm = np.random.default_rng(seed).permutation(len(ref_trajs))
        trajs = batch()
        shuffled = [trajs[i] for i in perm]
        out = _gigpo(shuffled, cfg)
        for j, i in enumerate(perm):
            # exactly equal: the group sums are exactly rounded, so the order cannot show
            np.testing.assert_array_equal(out.token[j], ref.token[i])
            assert shuffled[j].derived["step_advantages"] == ref_trajs[i].derived["step_advantages"]
            assert out.episode[j] == ref.episode[i]


# ---- contract and config ---------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
def test_estimator_contract(mode):
    from rllib_spear import SPEARConfig
    from rllib_spear.testing import check_estimator_contract

    check_estimator_contract("gigpo", SPEARConfig().training(advantage_estimator="gigpo", gigpo_mode=mode))


def test_config_knobs_defaults_and_validation():
    from rllib_spear import SPEARConfig

    cfg = SPEARConfig()
    # released defaults: gamma 0.95, omega 1, ALFWorld's mean_std_norm
    assert (cfg.gigpo_gamma, cfg.gigpo_step_weight, cfg.gigpo_mode) == (0.95, 1.0, "mean_std_norm")
    SPEARConfig().training(advantage_estimator="gigpo", gigpo_mode="mean_norm").validate()
    SPEARConfig().training(advantage_estimator="gigpo", gigpo_gamma=1, gigpo_step_weight=0).validate()
    for key, bad in (("gigpo_gamma", 1.5), ("gigpo_gamma", -0.1), ("gigpo_gamma", True),
                     ("gigpo_step_weight", -1.0), ("gigpo_step_weight", float("inf")),
                     ("gigpo_step_weight", float("nan")), ("gigpo_step_weight", "1"),
                     ("gigpo_mode", "mean"), ("gigpo_mode", None)):
        with pytest.raises(ValueError, match=f"`{key}`"):
            SPEARConfig().training(advantage_estimator="gigpo", **{key: bad}).validate()


# ---- input checks of the pure functions ------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "mean"}, "mode must be one of"),
    ({"eps": -1.0}, "eps"),
    ({"anchors": [["s"]]}, "anchors has 1 entries for 2"),
    ({"anchors": [["s"], ["s", "t"]]}, r"anchors\[1\] has 2 entries for 1 steps"),
    ({"anchors": [["s"], [["unhashable"]]]}, r"anchors\[1\]\[0\] is not hashable"),
    ({"uids": ["a"]}, "uids has 1 entries"),
    ({"step_returns": [[1.0], [float("nan")]]}, r"step_returns\[1\] must be finite"),
    ({"step_returns": []}, "step_returns is empty"),
])
def test_gigpo_step_advantages_bad_input(kwargs, match):
    args = {"step_returns": [[1.0], [2.0]], "anchors": [["s"], ["s"]], "uids": ["a", "a"], **kwargs}
    with pytest.raises(ValueError, match=match):
        gigpo_step_advantages(args.pop("step_returns"), args.pop("anchors"), args.pop("uids"), **args)


@pytest.mark.parametrize("kwargs, match", [
    ({"step_weight": -0.5}, "step_weight"),
    ({"step_weight": float("nan")}, "step_weight"),
    ({"gamma": 1.5}, "gamma"),
    ({"mode": "std"}, "mode"),
])
def test_gigpo_advantages_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gigpo_advantages([1.0, 2.0], [[1.0], [2.0]], [["s"], ["s"]], ["a", "a"], **kwargs)
    with pytest.raises(ValueError, match="step_rewards has 1 entries for 2"):
        gigpo_advantages([1.0, 2.0], [[1.0]], [["s"]], ["a", "a"])
