"""The recipe layer (no Ray): registries of the pieces an algorithm is assembled from, and the
:class:`Recipe` that runs them for one iteration.

Public API (add one, select it by name in the config, test it):

- ``register_advantage_estimator(name)``: ``fn(trajs, cfg) -> Advantages``; built-ins ``grpo``, ``spa``, ``gigpo``;
- ``register_reward_shaper(name)``: ``fn(trajs, step, cfg) -> metrics``; built-ins ``tool_call_bonus``,
  ``spader_diversity``; ``register_reward_fn(name)`` / ``.training(reward_fns=[fn])`` for
  ``fn(task, response, stats) -> float``;
- ``register_response_filter(name)``: ``fn(traj, cfg) -> bool``; built-ins ``overlong``,
  ``incomplete``, ``repetitive``, ``unreadable``;
- policy-loss modes and aggregations: ``rllib_spear.core.losses.register_policy_loss`` /
  ``register_loss_agg``; environments: ``rllib_spear.envs.register_env``; parsers:
  ``rllib_spear.envs.parsers.register_parser``.
"""
from __future__ import annotations

from .batching import LearnerRow, build_learner_batches
from .estimators import ADVANTAGE_ESTIMATORS, Advantages, register_advantage_estimator
from .filters import DRBOT_FILTERS, RESPONSE_FILTERS, FilterResult, register_response_filter
from .piece import Piece, collect_defaults
from .recipe import Recipe
from .rewards import REWARD_FNS, REWARD_SHAPERS, register_reward_fn, register_reward_shaper
from .self_imitation import SIL_DEFAULTS, ReplayPlan, SelfImitation
from .task_sampler import TaskSampler

__all__ = [
    "ADVANTAGE_ESTIMATORS", "REWARD_SHAPERS", "REWARD_FNS", "RESPONSE_FILTERS", "DRBOT_FILTERS",
    "register_advantage_estimator", "register_reward_shaper", "register_reward_fn", "register_response_filter",
    "Advantages", "FilterResult", "ReplayPlan", "Recipe", "SelfImitation", "SIL_DEFAULTS", "Piece",
    "collect_defaults", "LearnerRow", "build_learner_batches", "TaskSampler", "piece_knobs",
]


def piece_knobs() -> dict:
    """Every knob of every registered estimator, shaper and filter (name -> default)."""
    return collect_defaults(ADVANTAGE_ESTIMATORS, REWARD_SHAPERS, RESPONSE_FILTERS)
