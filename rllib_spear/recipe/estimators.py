"""Advantage estimators (docs/algorithms.md 1.1, 3.3 and 3.5), selected by ``advantage_estimator``.

An estimator maps the iteration's trajectories (rewards already shaped) to per-token advantages
and a scalar episode advantage per trajectory (R_i minus its group mean, what SIL admission
reads, 2.2). Add one with::

    @register_advantage_estimator("my_est", defaults={"my_knob": 1.0})
    def my_est(trajs, cfg) -> Advantages: ...

and select it with ``.training(advantage_estimator="my_est")``.
"""
from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..core.advantages import (GIGPO_MODES, GROUP_STATS_OVER, gigpo_advantages, group_advantages,
                               group_reward_stats, step_peer_advantages, step_row_advantages)
from ..core.trajectory import Trajectory
from ..registry import Registry
from .piece import ErrorFn, Piece, check_choice, piece_decorator

__all__ = ["Advantages", "ADVANTAGE_ESTIMATORS", "register_advantage_estimator", "step_rewards_with_outcome",
           "gigpo_anchors", "step_penalties", "env_step_rewards", "step_row_scores", "episode_advantages",
           "check_group_stats_over", "step_rows"]

ADVANTAGE_ESTIMATORS: Registry[Piece] = Registry(
    "advantage estimator", register_hint="rllib_spear.recipe.register_advantage_estimator")


@dataclass
class Advantages:
    """``token``: one array per trajectory, aligned with its ``input_ids`` (0 off assistant
    tokens); ``episode``: R_i - mean of its group (float64, one per trajectory; the mean over
    step rows with ``group_stats_over="steps"``)."""

    token: list[np.ndarray]
    episode: np.ndarray
    #: per trajectory, the advantage of each step (step-level estimators); what SIL's
    #: ``sil_admission="step"`` reads (2.2). None for an outcome estimator.
    step: list[np.ndarray] | None = None


def register_advantage_estimator(name: str, *, defaults: dict[str, Any] | None = None,
                                 validate: Callable[[Any, ErrorFn], None] | None = None,
                                 override: bool = False) -> Callable:
    """Decorator: register ``fn(trajs: list[Trajectory], cfg) -> Advantages`` under ``name``."""
    return piece_decorator(ADVANTAGE_ESTIMATORS, name, defaults=defaults, validate=validate, override=override)


def check_group_stats_over(cfg: Any, err: ErrorFn) -> None:
    """``group_stats_over`` (docs/algorithms.md 1.1) is one of :data:`GROUP_STATS_OVER`."""
    check_choice(cfg, err, "group_stats_over", GROUP_STATS_OVER)


def _stats_over(cfg: Any) -> str:
    """The config's ``group_stats_over`` (a config built before the knob existed: trajectories)."""
    return getattr(cfg, "group_stats_over", "trajectories")


def step_rewards_with_outcome(t: Trajectory) -> list[float]:
    """Per-step rewards r_k with the episode-level reward terms added on the last step, so that
    sum_k r_k == t.total_reward."""
    r = _padded_step_rewards(t)
    r[-1] += float(t.outcome_reward + sum(t.rewards.values()))
    return r


def step_rows(t: Trajectory) -> int:
    """How many step rows ``t`` counts for with ``group_stats_over="steps"`` (1.1): its steps, at least 1."""
    return len(_padded_step_rewards(t))


def _padded_step_rewards(t: Trajectory) -> list[float]:
    """``t.step_rewards``, one per step (a missing step pays 0; at least one entry)."""
    r = [float(x) for x in t.step_rewards] or [0.0]
    return r + [0.0] * max(0, t.num_steps - len(r))


def step_penalties(t: Trajectory, n_steps: int) -> list[float]:
    """The penalty each of ``n_steps`` steps was charged (``EpisodeStats.step_penalties``; 0 for a
    step the environment reported none for, and for a trajectory without stats)."""
    p = [] if t.stats is None or t.stats.step_penalties is None else list(t.stats.step_penalties)
    return (p + [0.0] * n_steps)[:n_steps]


def env_step_rewards(t: Trajectory) -> list[float]:
    """What the environment alone paid per step, penalties left out (docs/algorithms.md 3.5):
    ``r_k = step_rewards_k - p_k``, the outcome added on the last step; the named bonus terms
    (SPEAR's tool-call bonus) are not step rewards and stay out."""
    r = _padded_step_rewards(t)
    r = [x - p for x, p in zip(r, step_penalties(t, len(r)))]
    r[-1] += float(t.outcome_reward)
    return r


def step_row_scores(t: Trajectory) -> list[float]:
    """The episode score of each step row, as the released agent tree has it (3.5): the return
    without penalties plus the penalty of that row, ``s_k = R - sum_j p_j + p_k``."""
    p = step_penalties(t, step_rows(t))
    base = t.total_reward - math.fsum(p)
    return [base + x for x in p]


def episode_advantages(trajs: list[Trajectory], cfg: Any) -> np.ndarray:
    """What SIL admission reads (2.2): ``R_i - mean_g R``, with the mean over trajectories, or
    over step rows (a trajectory of K steps counts K times) with ``group_stats_over="steps"``."""
    rewards = np.array([t.total_reward for t in trajs], np.float64)
    uids = [t.uid for t in trajs]
    if _stats_over(cfg) != "steps":
        return group_advantages(rewards, uids, std_normalize=False)
    weights = [step_rows(t) for t in trajs]
    means = group_reward_stats(rewards, uids, weights=weights)
    return rewards - np.array([means[u][0] for u in uids])


@register_advantage_estimator("grpo", defaults={"std_normalize_advantages": True})
def grpo_advantages(trajs: list[Trajectory], cfg: Any) -> Advantages:
    """Outcome advantage (1.1): A_i = (R_i - mean_g R) [/ (std_g R + eps)] on every assistant
    token; with ``group_stats_over="steps"`` the group statistics are over step rows, each row
    scored ``step_row_scores`` (the released agent tree), so step k's tokens get A_{i,k}."""
    uids = [t.uid for t in trajs]
    if _stats_over(cfg) == "steps":
        rows = step_row_advantages([step_row_scores(t) for t in trajs], uids,
                                   std_normalize=cfg.std_normalize_advantages)
        return Advantages([t.token_advantages(a) for t, a in zip(trajs, rows)], episode_advantages(trajs, cfg))
    rewards = np.array([t.total_reward for t in trajs], np.float64)
    adv = group_advantages(rewards, uids, std_normalize=cfg.std_normalize_advantages)
    return Advantages([t.token_advantages(float(a)) for t, a in zip(trajs, adv)], adv)


def _check_gamma(cfg: Any, err: ErrorFn) -> None:
    if not 0 <= cfg.spa_gamma <= 1:
        err(f"`spa_gamma` must be in [0, 1], got {cfg.spa_gamma!r}")


@register_advantage_estimator("spa", defaults={"spa_gamma": 0.9}, validate=_check_gamma)
def spa_advantages(trajs: list[Trajectory], cfg: Any) -> Advantages:
    """SPADER's step-wise peer advantage (3.3) over per-step rewards; the episode-level terms
    (outcome, named components such as SPEAR's tool bonus) are paid on the last step. Writes
    ``derived["step_advantages"]`` on each trajectory."""
    per_step = [step_rewards_with_outcome(t) for t in trajs]
    step_adv = step_peer_advantages(per_step, [t.uid for t in trajs], gamma=cfg.spa_gamma)
    for t, a in zip(trajs, step_adv):
        t.derived["step_advantages"] = [float(x) for x in a]
    return Advantages([t.token_advantages(a) for t, a in zip(trajs, step_adv)], episode_advantages(trajs, cfg),
                      step=[np.asarray(a, np.float64) for a in step_adv])


def gigpo_anchors(t: Trajectory, n_steps: int) -> list[Hashable | None]:
    """The anchor state of each of ``n_steps`` steps of ``t`` (docs/algorithms.md 3.5): the
    environment state the step acted from, as the tuple of its token ids.

    Step 0: the prompt. Step k >= 1: the observation segment(s) between assistant turn k-1 and
    assistant turn k (the rollout writes one, ``Segment("observation", step=k-1)``). ``None``
    where step k >= 1 has no observation before it, or no assistant turn at all: an unknown
    state, which shares its step group with nobody (step advantage 0).
    """
    out: list[Hashable | None] = [None] * n_steps
    if n_steps:
        out[0] = tuple(t.segments[0].token_ids)
    pending: list[int] = []
    seen_assistant = False
    for seg in t.segments[1:]:
        if seg.kind == "assistant":
            if seen_assistant and 0 < seg.step < n_steps and pending:
                out[seg.step] = tuple(pending)
            seen_assistant, pending = True, []
        elif seen_assistant:
            pending.extend(seg.token_ids)
    return out


def _check_gigpo(cfg: Any, err: ErrorFn) -> None:
    g = cfg.gigpo_gamma
    if isinstance(g, bool) or not isinstance(g, (int, float)) or not 0 <= g <= 1:
        err(f"`gigpo_gamma` must be a number in [0, 1], got {g!r}")
    w = cfg.gigpo_step_weight
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
        err(f"`gigpo_step_weight` must be a finite number >= 0, got {w!r}")
    check_choice(cfg, err, "gigpo_mode", GIGPO_MODES)


@register_advantage_estimator(
    "gigpo", defaults={"gigpo_gamma": 0.95, "gigpo_step_weight": 1.0, "gigpo_mode": "mean_std_norm"},
    validate=_check_gigpo)
def gigpo_advantages_estimator(trajs: list[Trajectory], cfg: Any) -> Advantages:
    """GiGPO (3.5): the episode advantage of R_i in its uid group plus ``gigpo_step_weight`` times
    the step advantage of the discounted return G_k in its anchor-state group (steps of the same
    uid acting from the same state, ``gigpo_anchors``), normalized by ``gigpo_mode``.

    As in the released agent tree, G_k reads the environment's rewards alone
    (``env_step_rewards``: the outcome on the last step, no bonus terms, no penalties) and each
    step's penalty (``EpisodeStats.step_penalties``) is charged to that step only, after
    discounting; the bonus terms enter the episode score. ``group_stats_over`` decides whether
    the episode group's statistics are over trajectories or over step rows (each row scored with
    its own penalty). Writes ``derived["step_advantages"]`` on each trajectory."""
    env_rewards = [env_step_rewards(t) for t in trajs]
    pens = [step_penalties(t, len(r)) for t, r in zip(trajs, env_rewards)]
    scores = [t.total_reward - math.fsum(p) for t, p in zip(trajs, pens)]
    adv = gigpo_advantages(
        scores, env_rewards, [gigpo_anchors(t, len(r)) for t, r in zip(trajs, env_rewards)],
        [t.uid for t in trajs], gamma=cfg.gigpo_gamma, step_weight=cfg.gigpo_step_weight, mode=cfg.gigpo_mode,
        step_penalties=pens, group_stats_over=_stats_over(cfg))
    for t, a in zip(trajs, adv):
        t.derived["step_advantages"] = [float(x) for x in a]
    return Advantages([t.token_advantages(a) for t, a in zip(trajs, adv)], episode_advantages(trajs, cfg),
                      step=[np.asarray(a, np.float64) for a in adv])
