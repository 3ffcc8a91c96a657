"""Option combinations: SPADER + SIL replay, and SPEAR + SPA (step-wise) advantages."""
from __future__ import annotations

import math

import numpy as np
import pytest

import rllib_spear  # noqa: F401  (registers the algorithms)
from rllib_spear import SPADERConfig, SPEARConfig
from rllib_spear.core.trajectory import Segment, Trajectory
from rllib_spear.recipe import Recipe
from rllib_spear.testing import make_stats

from e2e_helpers import recorder, small_config, with_trajectory_hook


# ----------------------------------------------------------------------------------------------
# (a) SPADER with self-imitation (SIL) on multi_answer_search
# ----------------------------------------------------------------------------------------------
SIL_KEYS = {"sil_size", "sil_added", "sil_replay_events", "sil_replayed_samples",
            "sil_num_above_baseline", "sil_baseline_mean", "sil_weight"}


def test_spader_with_sil_two_iterations(ray_session, tiny_model):
    cfg = (small_config(SPADERConfig, tiny_model, sil_enabled=True, sil_capacity=1,
                        sil_tolerate_steps=10)
           .environment("multi_answer_search")
           .env_runners(max_turns=3))
    assert cfg.advantage_estimator == "spa"

    def synthetic_f1(trajs, stats, algorithm):
        # An untrained model never answers: give every group the same synthetic spread of
        # F1 scores (and no discoveries) so that SPADER's rewards, hence the advantages and
        # the SIL admissions, are deterministic. Per group [1, 0, 0.5, 0]: mean 0.375.
        seen: dict[str, int] = {}
        for t in trajs:
            k = seen.get(t.uid, 0)
            seen[t.uid] = k + 1
            n = max(t.num_steps, 1)
            t.stats.f1 = [1.0, 0.0, 0.5, 0.0][k % 4]
            t.stats.format_ok = True
            t.stats.found_entities_per_step = [[] for _ in range(n)]
            t.stats.queries_per_step = [0] * n

    algo = with_trajectory_hook(cfg, synthetic_f1).build_algo()
    try:
        assert algo.recipe.sil is not None
        r1 = algo.train()
        s1 = r1["spear"]
        assert SIL_KEYS <= set(s1), SIL_KEYS - set(s1)
        # 2 groups x 2 trajectories with R_i above the group mean entered the buffer
        assert s1["sil_added"] == 4, s1
        assert s1["sil_size"] == 4, s1
        assert s1["sil_replay_events"] == 0  # the replay of step 1 was drawn before the adds
        assert s1["sil_num_above_baseline"] == 4 and math.isclose(s1["sil_baseline_mean"], 0.375)

        r2 = algo.train()
        s2 = r2["spear"]
        # 4 entries above the baseline > 1.5 * capacity: a burst replays min(4, capacity=1)
        # trajectory, clears the buffer, then step 2 adds its own 4.
        assert s2["sil_replay_events"] == 1, s2
        assert s2["sil_replayed_samples"] == 1, s2
        assert s2["sil_added"] == 8 and s2["sil_size"] == 4, s2
        assert 0.0 < s2["sil_weight"] < 1.0
        learner = r2["learners"]["default_policy"]
        assert any(k.startswith("sil_") for k in learner), sorted(learner)
        assert r2["env_runners"]["policy_version_lag_max"] == 0
    finally:
        algo.stop()


# ----------------------------------------------------------------------------------------------
# (b) SPEAR with SPA advantages: outcome + tool bonus paid on the last step
# ----------------------------------------------------------------------------------------------
def _traj(uid, n_steps, outcome, tool_calls, traj_id):
    segs, tok = [Segment("prompt", [1, 2, 3])], 10
    for k in range(n_steps):
        segs.append(Segment("assistant", [tok, tok + 1], logprobs=[-0.5, -0.5], step=k))
        tok += 2
        if k < n_steps - 1:
            segs.append(Segment("observation", [tok], step=k))
            tok += 1
    return Trajectory(uid=uid, segments=segs, outcome_reward=outcome,
                      step_rewards=[0.0] * n_steps, stats=make_stats(tool_calls=tool_calls),
                      traj_id=traj_id)


def _spear(**training):
    """SPEAR's recipe (its pieces as the algorithm assembles them), without a model or Ray."""
    return Recipe(SPEARConfig().training(**training))


def _adv(values):
    """(G - mean) / sqrt(population var + 1e-6), written out."""
    mu = sum(values) / len(values)
    var = sum((v - mu) ** 2 for v in values) / len(values)
    return [(v - mu) / math.sqrt(var + 1e-6) for v in values]


def test_spear_spa_advantages_by_hand():
    algo = _spear(advantage_estimator="spa", spa_gamma=0.9, tool_reward_schedule="constant")
    # A: 3 steps, correct, 2 tool calls; B: 2 steps, wrong, 1 call; C: 1 step, correct, no call.
    a = _traj("q", 3, 1.0, 2, "a")
    b = _traj("q", 2, 0.0, 1, "b")
    c = _traj("q", 1, 1.0, 0, "c")
    trajs = [a, b, c]
    algo.shape_rewards(trajs, step=1)
    # lambda_tool = 1 (constant); r_tool = min(0.1 * calls, 1)
    assert [t.rewards["tool_bonus"] for t in trajs] == pytest.approx([0.2, 0.1, 0.0])
    adv = algo.advantages(trajs)
    token_adv, episode_adv = adv.token, adv.episode

    # Per-step rewards: everything on the last step. A: [0, 0, 1.2], B: [0, 0.1], C: [1.0].
    # Discounted returns (gamma 0.9): A: [0.972, 1.08, 1.2], B: [0.09, 0.1], C: [1.0];
    # missing steps count as 0 in the peer statistics.
    g = 0.9
    step0 = _adv([g * g * 1.2, g * 0.1, 1.0])
    step1 = _adv([g * 1.2, 0.1, 0.0])
    step2 = _adv([1.2, 0.0, 0.0])
    expected = {"a": [step0[0], step1[0], step2[0]], "b": [step0[1], step1[1]], "c": [step0[2]]}
    for t in trajs:
        assert t.derived["step_advantages"] == pytest.approx(expected[t.traj_id], abs=1e-9), t.traj_id
    # Hand values (rounded): step 0 [0.6737, -1.4137, 0.7400], step 1 [1.4092, -0.6020, -0.8072]
    assert step0 == pytest.approx([0.6737, -1.4137, 0.7400], abs=1e-3)
    assert step1 == pytest.approx([1.4092, -0.6020, -0.8072], abs=1e-3)
    assert step2 == pytest.approx([1.4142, -0.7071, -0.7071], abs=1e-3)

    # Token advantages: step k's assistant tokens get A_k; prompt/observation tokens get 0.
    for t, adv in zip(trajs, token_adv):
        steps = t.token_steps()
        for k, ak in enumerate(expected[t.traj_id]):
            assert np.allclose(adv[steps == k], ak, atol=1e-6)
        assert np.all(adv[steps < 0] == 0)
    # Episode advantage (SIL admission): R_i - group mean, R = [1.2, 0.1, 1.0].
    assert episode_adv == pytest.approx([1.2 - 2.3 / 3, 0.1 - 2.3 / 3, 1.0 - 2.3 / 3])

    # The tool bonus matters: without it the last-step rewards (and advantages) differ.
    algo0 = _spear(advantage_estimator="spa", tool_reward_schedule="none")
    t0 = [_traj("q", 3, 1.0, 2, "a"), _traj("q", 2, 0.0, 1, "b"), _traj("q", 1, 1.0, 0, "c")]
    algo0.shape_rewards(t0, step=1)
    algo0.advantages(t0)
    assert t0[0].derived["step_advantages"][0] != pytest.approx(expected["a"][0], abs=1e-3)


def test_spear_spa_one_iteration(ray_session, tiny_model):
    cfg = small_config(SPEARConfig, tiny_model, advantage_estimator="spa")
    # untrained model: seeded outcome rewards so that advantages are real
    hook, captured = recorder(synthetic_rewards=True, seed=7, values=(0.0, 1.0))
    algo = with_trajectory_hook(cfg, hook).build_algo()
    try:
        r = algo.train()
        trajs = captured[0][0]
        assert all(len(t.derived["step_advantages"]) == t.num_steps for t in trajs)
        assert any(abs(a) > 0 for t in trajs for a in t.derived["step_advantages"])
        learner = r["learners"]["default_policy"]
        assert learner["num_optimizer_steps"] >= 1 and learner["grad_norm"] > 0
        assert "entropy" in learner  # entropy_coeff 0.001: computed on every micro-batch
        assert r["env_runners"]["policy_version_lag_max"] == 0
    finally:
        algo.stop()
