"""Advantage estimators (docs/algorithms.md 1.1 and 3.3), selected by ``advantage_estimator``.

An estimator maps the iteration's trajectories (rewards already shaped) to per-token advantages
and a scalar episode advantage per trajectory (R_i minus its group mean, what SIL admission
reads, 2.2). Add one with::

    @register_advantage_estimator("my_est", defaults={"my_knob": 1.0})
    def my_est(trajs, cfg) -> Advantages: ...

and select it with ``.training(advantage_estimator="my_est")``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..core.advantages import group_advantages, step_peer_advantages
from ..core.trajectory import Trajectory
from ..registry import Registry
from .piece import ErrorFn, Piece, piece_decorator

__all__ = ["Advantages", "ADVANTAGE_ESTIMATORS", "register_advantage_estimator", "step_rewards_with_outcome"]

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
