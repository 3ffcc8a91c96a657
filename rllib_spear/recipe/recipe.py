"""The algorithm of one iteration, assembled from registered pieces named by a config (no Ray).

``Recipe(cfg)`` reads the names in the config (``reward_shapers``, ``reward_fns``,
``advantage_estimator``, ``response_filters``, ``sil_enabled``) and looks each piece up in its
registry. The RLlib ``Algorithm`` calls, in order (docs/algorithms.md 1-3)::

    metrics = recipe.shape_rewards(trajs, step)     # 2.1 tool bonus, 3.2 diversity, user rewards
    adv = recipe.advantages(trajs)                  # 1.1 group / 3.3 step-wise peer advantages
    kept = recipe.filter(trajs)                     # 1.5 response and group filters
    rows = recipe.learner_rows(trajs, adv, kept)
    replay = recipe.replay(step)                    # 2.2/2.3 SIL (a): before admitting this batch
    ... learner update(s) ...
    metrics = recipe.after_update(trajs, adv, kept, step)   # SIL (b)+(c)

Tests and users can drive a recipe directly on hand-made trajectories.
"""
from __future__ import annotations

from typing import Any

from ..core.trajectory import Trajectory
from .batching import LearnerRow
from .estimators import ADVANTAGE_ESTIMATORS, Advantages
from .filters import FilterResult, apply_filters
from .rewards import REWARD_SHAPERS, apply_reward_fns, resolve_reward_fns
from .self_imitation import ReplayPlan, SelfImitation

__all__ = ["Recipe", "Metrics"]

#: {(namespace, key): value}: what the Algorithm logs with ``self.metrics.log_value``.
Metrics = dict[tuple[str, str], float]


class Recipe:
    """The pieces of one algorithm config, looked up by name."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.shapers = [REWARD_SHAPERS.get(name) for name in cfg.reward_shapers]
        self.reward_fns = resolve_reward_fns(cfg.reward_fns)
        self.estimator = ADVANTAGE_ESTIMATORS.get(cfg.advantage_estimator)
        self.sil = SelfImitation(cfg) if cfg.sil_enabled else None

    def shape_rewards(self, trajs: list[Trajectory], step: int) -> Metrics:
        """Every shaper in ``reward_shapers`` order, then the user reward functions."""
        out: Metrics = {}
        for shaper in self.shapers:
            ns = shaper.metrics_namespace or shaper.name
            out.update({(ns, k): v for k, v in (shaper(trajs, step, self.cfg) or {}).items()})
        if self.reward_fns:
            apply_reward_fns(trajs, self.reward_fns)
        return out

    def advantages(self, trajs: list[Trajectory]) -> Advantages:
        return self.estimator(trajs, self.cfg)

    def filter(self, trajs: list[Trajectory]) -> FilterResult:
        return apply_filters(trajs, self.cfg)

    @staticmethod
    def learner_rows(trajs: list[Trajectory], adv: Advantages, kept: FilterResult) -> list[LearnerRow]:
        return [LearnerRow(t, a, m) for t, a, m in zip(trajs, adv.token, kept.masks)]

    def replay(self, step: int) -> ReplayPlan:
        if self.sil is None:
            return ReplayPlan([], 0.0, False)
        return self.sil.replay_rows(step)

    def after_update(self, trajs: list[Trajectory], adv: Advantages, kept: FilterResult,
                     step: int, replay: ReplayPlan) -> Metrics:
        if self.sil is None:
            return {}
        admitted = self.sil.admit(trajs, adv.episode, kept.filtered, step, adv.step, masked_steps=kept.masked_steps)
        out = {("spear", k): v for k, v in admitted.items()}
        out[("spear", "sil_weight")] = replay.weight
        return out

    @property
    def replay_buffer(self) -> Any:
        """SIL's replay buffer (None without SIL): what the algorithm holds as ``local_replay_buffer``."""
        return None if self.sil is None else self.sil.buffer

    # ---- checkpoint state (the SIL buffer; everything else is a function of the config)
    def get_state(self) -> dict[str, Any]:
        """``{"sil_buffer": state or None}``: None without SIL or with ``store_buffer_in_checkpoints=False``."""
        return {"sil_buffer": None if self.sil is None else self.sil.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        if self.sil is not None:
            self.sil.set_state(state.get("sil_buffer"))
