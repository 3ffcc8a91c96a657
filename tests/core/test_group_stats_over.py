"""Hand-computed checks of the released agent tree's forms (docs/algorithms.md 1.1, 3.5, 5):
group statistics over step rows (``group_stats_over="steps"``), GiGPO's step returns from the
environment alone with the invalid-action penalty on its own row, and SIL's step admission."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from rllib_spear.core.advantages import group_reward_stats, step_row_advantages
from rllib_spear.core.episode import EpisodeStats
from rllib_spear.core.trajectory import Segment, Trajectory
from rllib_spear.recipe import ADVANTAGE_ESTIMATORS

EPS = 1e-6
P = [1, 2, 3]


def _stats(penalties: list[float] | None = None, tool_calls: int = 1) -> EpisodeStats:
    return EpisodeStats(success=False, outcome_reward=0.0, tool_calls=tool_calls, queries_per_step=[],
                        format_ok=True, has_answer=True, step_penalties=penalties)


def _traj(uid: str, n_steps: int, *, obs_base: int, step_rewards: list[float], outcome: float = 0.0,
          penalties: list[float] | None = None, bonus: float = 0.0, traj_id: str = "") -> Trajectory:
    """Prompt P, then n_steps assistant turns; the observation after turn k is [obs_base + k]
    (distinct per trajectory, so only the steps from P share a step group)."""
    segs = [Segment("prompt", list(P))]
    for k in range(n_steps):
        segs.append(Segment("assistant", [100 + k, 200 + k], logprobs=[-0.5, -0.5], step=k))
        if k < n_steps - 1:
            segs.append(Segment("observation", [obs_base + k], step=k))
    t = Trajectory(uid=uid, segments=segs, outcome_reward=outcome, step_rewards=list(step_rewards),
                   stats=_stats(penalties), traj_id=traj_id or f"{uid}-{obs_base}")
    if bonus:
        t.rewards["tool_bonus"] = bonus
    return t


def _cfg(**kw) -> SimpleNamespace:
    base = dict(gigpo_gamma=0.5, gigpo_step_weight=1.0, gigpo_mode="mean_norm", std_normalize_advantages=False,
                group_stats_over="trajectories")
    return SimpleNamespace(**{**base, **kw})


def _est(name, trajs, cfg):
    return ADVANTAGE_ESTIMATORS.get(name)(trajs, cfg)


# ---- core: statistics over step rows -----------------------------------------------------------
def test_step_row_advantages_weigh_a_trajectory_by_its_steps():
    # rows: A (1 step) scores [1]; B (3 steps) [0, 0, 0]: mean 1/4; unbiased var (0.75^2 + 3 * 0.25^2) / 3 = 0.25
    a, b = step_row_advantages([[1.0], [0.0, 0.0, 0.0]], ["q", "q"], std_normalize=False)
    np.testing.assert_allclose(a, [0.75])
    np.testing.assert_allclose(b, [-0.25] * 3)
    a, b = step_row_advantages([[1.0], [0.0, 0.0, 0.0]], ["q", "q"], std_normalize=True)
    np.testing.assert_allclose(a, [0.75 / (0.5 + EPS)])
    np.testing.assert_allclose(b, [-0.25 / (0.5 + EPS)] * 3)


def test_step_row_singletons_count_rows():
    # a lone 1-step trajectory keeps its score (mean 0, std 1); a lone 3-step one with equal rows gets 0
    (a,), = [step_row_advantages([[2.0]], ["q"], std_normalize=True)]
    np.testing.assert_allclose(a, [2.0 / (1 + EPS)])
    (b,) = step_row_advantages([[2.0, 2.0, 2.0]], ["r"], std_normalize=True)
    assert np.all(b == 0.0)
    assert [len(x) for x in step_row_advantages([[], [1.0]], ["q", "q"], std_normalize=False)] == [0, 1]


def test_group_reward_stats_with_step_weights():
    stats = group_reward_stats([1.0, 0.0], ["q", "q"], weights=[1, 3])
    mean, std = stats["q"]
    assert mean == pytest.approx(0.25)
    assert std == pytest.approx(math.sqrt(0.1875))
    with pytest.raises(ValueError, match="weights"):
        group_reward_stats([1.0, 0.0], ["q", "q"], weights=[1.5, 3])


# ---- grpo with group_stats_over ----------------------------------------------------------------
def test_grpo_steps_weighs_trajectories_by_their_steps():
    a = _traj("q", 1, obs_base=10, step_rewards=[0.0], outcome=1.0)
    b = _traj("q", 3, obs_base=20, step_rewards=[0.0, 0.0, 0.0])
    traj = _est("grpo", [a, b], _cfg())
    assert traj.token[0][a.token_steps() >= 0] == pytest.approx(0.5)  # (1 - 0.5), each trajectory once
    steps = _est("grpo", [a, b], _cfg(group_stats_over="steps"))
    np.testing.assert_allclose(steps.token[0][a.token_steps() >= 0], 0.75)  # mean over 4 rows: 0.25
    np.testing.assert_allclose(steps.token[1][b.token_steps() >= 0], -0.25)
    np.testing.assert_allclose(steps.episode, [0.75, -0.25])  # what SIL admission reads


# ---- GiGPO: the released split of returns, bonus and penalty ------------------------------------
def test_gigpo_bonus_enters_the_episode_score_only():
    """The issue's probe: two failed episodes of 2 and 3 turns whose tool-call bonus differs. With the
    bonus paid on the last step, mean_std_norm made it a unit-sized step advantage (+-1.4 at the
    shared prompt); the environment paid nothing, so the released step advantage is 0."""
    a = _traj("q", 2, obs_base=10, step_rewards=[0.0, 0.0], bonus=0.2)
    b = _traj("q", 3, obs_base=20, step_rewards=[0.0, 0.0, 0.0], bonus=0.3)
    adv = _est("gigpo", [a, b], _cfg(gigpo_gamma=0.95, gigpo_mode="mean_std_norm"))
    ep = 0.05 / (math.sqrt(0.005) + EPS)  # (R - mean) / (std + eps) over the two trajectories
    np.testing.assert_allclose(a.derived["step_advantages"], [-ep, -ep], rtol=1e-12)
    np.testing.assert_allclose(b.derived["step_advantages"], [ep, ep, ep], rtol=1e-12)
    np.testing.assert_allclose(adv.step[0], [-ep, -ep], rtol=1e-12)


def _penalty_pair():
    """gamma 0.5. A: valid, invalid (-0.1), win (outcome 1): env paid [0, -0.1, 1], so step rewards
    [0, -0.1, 0], penalties [0, -0.1, 0], R = 0.9. B: three valid steps, nothing won.
    A's returns from the environment alone: [0.25, 0.5, 1], then the penalty on its row: [0.25, 0.4, 1]
    (today's form discounted it into step 0: 0.5 * (-0.1 + 0.5) = 0.2). B: [0, 0, 0].
    Only the steps from P share a group: {0.25, 0} -> +-0.125."""
    a = _traj("q", 3, obs_base=10, step_rewards=[0.0, -0.1, 0.0], outcome=1.0, penalties=[0.0, -0.1, 0.0])
    b = _traj("q", 3, obs_base=20, step_rewards=[0.0, 0.0, 0.0], penalties=[0.0, 0.0, 0.0])
    return a, b


def test_gigpo_penalty_is_charged_to_its_own_row_after_discounting():
    a, b = _penalty_pair()
    _est("gigpo", [a, b], _cfg())
    # episode: totals 0.9 and 0 -> +-0.45 on every step
    np.testing.assert_allclose(a.derived["step_advantages"], [0.45 + 0.125, 0.45, 0.45], atol=1e-12)
    np.testing.assert_allclose(b.derived["step_advantages"], [-0.45 - 0.125, -0.45, -0.45], atol=1e-12)


def test_gigpo_steps_scores_each_row_with_its_own_penalty():
    a, b = _penalty_pair()
    _est("gigpo", [a, b], _cfg(group_stats_over="steps"))
    # rows: A [1.0, 0.9, 1.0] (R without penalties, plus the row's), B [0, 0, 0]: mean 2.9 / 6
    m = 2.9 / 6
    np.testing.assert_allclose(a.derived["step_advantages"], [1.0 - m + 0.125, 0.9 - m, 1.0 - m], atol=1e-12)
    np.testing.assert_allclose(b.derived["step_advantages"], [-m - 0.125, -m, -m], atol=1e-12)


def test_gigpo_without_reported_penalties_keeps_step_rewards_in_the_returns():
    """An environment that reports no step_penalties: its step rewards are the environment's."""
    a = _traj("q", 2, obs_base=10, step_rewards=[0.5, 0.0], outcome=1.0, penalties=None)
    b = _traj("q", 2, obs_base=20, step_rewards=[0.0, 0.0], penalties=None)
    _est("gigpo", [a, b], _cfg())
    # returns A [0.5 + 0.5, 1] = [1, 1], B [0, 0]; step-0 group +-0.5; episode R 1.5 / 0: +-0.75
    np.testing.assert_allclose(a.derived["step_advantages"], [1.25, 0.75])
    np.testing.assert_allclose(b.derived["step_advantages"], [-1.25, -0.75])


def test_text_game_reports_the_penalty_of_each_step():
    from rllib_spear.envs.text_game import TextGameEnv
    env = TextGameEnv(max_turns=3)
    env.reset({"seed": 3})
    env.step("<think>x</think><action>fly away</action>")
    env.step(f"<think>x</think><action>{env.admissible[0]}</action>")
    assert env.episode_stats().step_penalties == [-0.1, 0.0]


# ---- SIL: baselines over step rows, admission per step ------------------------------------------
def _sil_cfg(**kw):
    from rllib_spear.algorithms.spear import SPEARConfig
    cfg = SPEARConfig().training(sil_enabled=True, advantage_estimator="gigpo", **kw)
    return cfg


def test_sil_baseline_over_step_rows_and_step_admission():
    from rllib_spear.recipe.self_imitation import SelfImitation
    a, b = _penalty_pair()
    cfg = _sil_cfg(group_stats_over="steps", sil_admission="step", gigpo_gamma=0.5, gigpo_mode="mean_norm")
    adv = _est("gigpo", [a, b], cfg)
    sil = SelfImitation(cfg)
    sil.admit([a, b], adv.episode, [False, False], step=1, step_adv=adv.step)
    state = sil.buffer.get_state()
    # the baseline mean is over 6 rows: (3 * 0.9 + 3 * 0) / 6; the population std over them 0.45
    assert state["baseline_history"][-1]["means"] == pytest.approx([0.45])
    assert state["baseline_history"][-1]["stds"] == pytest.approx([0.45])
    entries = state["entries"]
    # A's rows are all > 0, B's none
    assert [e["trajectory"]["derived"]["sil_steps"] for e in entries] == [[0, 1, 2]]
    cfg_ep = _sil_cfg(group_stats_over="steps", gigpo_gamma=0.5, gigpo_mode="mean_norm")
    sil_ep = SelfImitation(cfg_ep)
    sil_ep.admit([a, b], adv.episode, [False, False], step=1, step_adv=adv.step)
    assert ["sil_steps" in e["trajectory"]["derived"] for e in sil_ep.buffer.get_state()["entries"]] == [False]


def test_sil_step_admission_replays_only_the_admitted_steps():
    from rllib_spear.recipe.self_imitation import _admit_steps, _replay_mask
    a, _ = _penalty_pair()
    (copy,), (value,) = _admit_steps([a], [np.array([0.3, -0.2, 0.1])])
    assert copy.derived["sil_steps"] == [0, 2] and value == pytest.approx(0.3)
    assert "sil_steps" not in a.derived  # the batch's trajectory is not changed
    mask = _replay_mask(copy)
    steps = copy.token_steps()
    assert mask[steps == 0].tolist() == [1.0, 1.0] and mask[steps == 1].tolist() == [0.0, 0.0]
    assert mask[steps == 2].tolist() == [1.0, 1.0] and mask[steps < 0].sum() == 0
    with pytest.raises(ValueError, match="sil_admission='step'"):
        _admit_steps([a], None)


def test_group_stats_over_and_sil_admission_are_validated():
    from rllib_spear.algorithms.spear import SPEARConfig
    cfg = SPEARConfig()
    assert (cfg.group_stats_over, cfg.sil_admission) == ("trajectories", "episode")
    with pytest.raises(ValueError, match="group_stats_over"):
        SPEARConfig().training(group_stats_over="rows").validate()
    with pytest.raises(ValueError, match="sil_admission"):
        SPEARConfig().training(sil_admission="row").validate()
