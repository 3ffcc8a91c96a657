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

from ..core.advantages import GIGPO_MODES, gigpo_advantages, group_advantages, step_peer_advantages
from ..core.trajectory import Trajectory
from ..registry import Registry
from .piece import ErrorFn, Piece, check_choice, piece_decorator

__all__ = ["Advantages", "ADVANTAGE_ESTIMATORS", "register_advantage_estimator", "step_rewards_with_outcome",
           "gigpo_anchors"]

ADVANTAGE_ESTIMATORS: Registry[Piece] = Registry(
    "advantage estimator", register_hint="rllib_spear.recipe.register_advantage_estimator")


@dataclass
class Advantages:
    """``token``: one array per trajectory, aligned with its ``input_ids`` (0 off assistant
    tokens); ``episode``: R_i - mean of its group (float64, one per trajectory)."""

    token: list[np.ndarray]
    episode: np.ndarray


def register_advantage_estimator(name: str, *, defaults: dict[str, Any] | None = None,
                                 validate: Callable[[Any, ErrorFn], None] | None = None,
                                 override: bool = False) -> Callable:
    """Decorator: register ``fn(trajs: list[Trajectory], cfg) -> Advantages`` under ``name``."""
    return piece_decorator(ADVANTAGE_ESTIMATORS, name, defaults=defaults, validate=validate, override=override)


def _episode_advantages(trajs: list[Trajectory]) -> np.ndarray:
    rewards = np.array([t.total_reward for t in trajs], np.float64)
    return group_advantages(rewards, [t.uid for t in trajs], std_normalize=False)


@register_advantage_estimator("grpo", defaults={"std_normalize_advantages": True})
def grpo_advantages(trajs: list[Trajectory], cfg: Any) -> Advantages:
    """Outcome advantage (1.1): A_i = (R_i - mean_g R) [/ (std_g R + eps)] on every assistant token."""
    rewards = np.array([t.total_reward for t in trajs], np.float64)
    adv = group_advantages(rewards, [t.uid for t in trajs], std_normalize=cfg.std_normalize_advantages)
    return Advantages([t.token_advantages(float(a)) for t, a in zip(trajs, adv)], adv)


def step_rewards_with_outcome(t: Trajectory) -> list[float]:
    """Per-step rewards r_k with the episode-level reward terms added on the last step, so that
    sum_k r_k == t.total_reward."""
    r = [float(x) for x in t.step_rewards] or [0.0]
    r = r + [0.0] * max(0, t.num_steps - len(r))
    r[-1] += float(t.outcome_reward + sum(t.rewards.values()))
    return r


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
    return Advantages([t.token_advantages(a) for t, a in zip(trajs, step_adv)], _episode_advantages(trajs))


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
    uid acting from the same state, ``gigpo_anchors``), normalized by ``gigpo_mode``. The
    episode-level terms (outcome, named components) are paid on the last step. Writes
    ``derived["step_advantages"]`` on each trajectory."""
    per_step = [step_rewards_with_outcome(t) for t in trajs]
    adv = gigpo_advantages(
        [t.total_reward for t in trajs], per_step, [gigpo_anchors(t, len(r)) for t, r in zip(trajs, per_step)],
        [t.uid for t in trajs], gamma=cfg.gigpo_gamma, step_weight=cfg.gigpo_step_weight, mode=cfg.gigpo_mode)
    for t, a in zip(trajs, adv):
        t.derived["step_advantages"] = [float(x) for x in a]
    return Advantages([t.token_advantages(a) for t, a in zip(trajs, adv)], _episode_advantages(trajs))
