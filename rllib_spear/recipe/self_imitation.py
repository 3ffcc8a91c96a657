"""Self-imitation learning (SPEAR, docs/algorithms.md 2.2-2.3) as a feature any algorithm can
switch on with ``.training(sil_enabled=True)``.

Order within iteration t: (a) ``replay_rows(t)`` samples the buffer before this step's batch is
added, with loss weight ``sil_weight(t)``; (b)+(c) ``admit`` evicts stale entries, records the
group baselines and admits this step's positive-advantage trajectories.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.advantages import group_reward_stats
from ..core.schedules import sil_weight
from ..core.trajectory import Trajectory
from .batching import LearnerRow
from .piece import ErrorFn, check_choice, check_ints, check_numbers
from .sil_buffer import SILReplayBuffer

__all__ = ["SIL_DEFAULTS", "validate_sil", "SelfImitation", "ReplayPlan"]

SIL_DEFAULTS: dict[str, Any] = {
    # 2.2 replay buffer
    "sil_enabled": False,
    "sil_capacity": 2048,
    "sil_tolerate_steps": 5,
    "sil_baseline_buffer_size": 10240,
    "sil_trigger": "burst",  # "burst" | "continuous"
    "sil_replay_batch_size": 64,  # continuous mode
    "sil_min_replay_size": 1,
    "sil_require_tool_call": False,
    "sil_keep_zero": True,  # agent: keep A~ >= 0; math: > 0
    "sil_std_normalize": False,
    # 2.3 SIL loss weight and combination
    "sil_update": "sequential",  # "sequential" (released) | "joint" (paper)
    "sil_kappa": 1.0,
    "sil_weight_steps": 200,  # T_SIL
    # 1.4 Clip-Cov for replayed data (agent code)
    "replay_clip_cov_ratio": 0.02,
    "replay_clip_cov_lb": 2.0,
    "replay_clip_cov_ub": 60.0,
}


def validate_sil(cfg: Any, err: ErrorFn) -> None:
    """The SIL knobs (checked whether or not SIL is on: a bad value is a bad value)."""
    check_choice(cfg, err, "sil_trigger", ("burst", "continuous"))
    check_choice(cfg, err, "sil_update", ("sequential", "joint"))
    if not (0 <= cfg.sil_tolerate_steps <= 10):
        err(f"`sil_tolerate_steps` must be in [0, 10] (the released code clamps at 10), got {cfg.sil_tolerate_steps!r}")
    check_ints(cfg, err, ("sil_weight_steps", "sil_capacity", "sil_baseline_buffer_size", "sil_replay_batch_size"), 1)
    check_numbers(cfg, err, ("sil_kappa",))


@dataclass
class ReplayPlan:
    """Replayed rows of this step, their loss weight, and whether they join the on-policy update
    (``sil_update="joint"``) or get their own optimizer steps after it (``"sequential"``)."""

    rows: list[LearnerRow]
    weight: float
    joint: bool


class SelfImitation:
    """The SIL buffer plus its schedule; state is checkpointed with the algorithm."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.buffer = SILReplayBuffer(
            capacity=cfg.sil_capacity, tolerate_steps=cfg.sil_tolerate_steps,
            baseline_buffer_size=cfg.sil_baseline_buffer_size, trigger=cfg.sil_trigger,
            replay_batch_size=cfg.sil_replay_batch_size, std_normalize=cfg.sil_std_normalize,
            keep_zero=cfg.sil_keep_zero, require_tool_call=cfg.sil_require_tool_call,
            min_replay_size=cfg.sil_min_replay_size, seed=int(cfg.seed or 0),
        )

    def replay_rows(self, step: int) -> ReplayPlan:
        """(a): sample before this step's batch is added; w_SIL(t) = sil_weight(t) (2.3)."""
        w = sil_weight(step, self.cfg.sil_kappa, self.cfg.sil_weight_steps)
        rows = [LearnerRow(t, t.token_advantages(float(a)), t.loss_mask(), is_replay=True, loss_weight=w)
                for t, a in self.buffer.sample_replay(step)]
        return ReplayPlan(rows, w, self.cfg.sil_update == "joint")

    def admit(self, trajs: list[Trajectory], episode_adv: np.ndarray, filtered: list[bool],
              step: int) -> dict[str, float]:
        """(b)+(c): evict stale entries, record baselines, admit positive-advantage trajectories."""
        stats = group_reward_stats([t.total_reward for t in trajs], [t.uid for t in trajs])
        self.buffer.add_batch(trajs, [float(a) for a in episode_adv], step,
                              group_means=[v[0] for v in stats.values()],
                              group_stds=[v[1] for v in stats.values()], loss_masks_zeroed=filtered)
        return {f"sil_{k}": float(v) for k, v in self.buffer.metrics().items()}

    def get_state(self) -> dict[str, Any]:
        return self.buffer.get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        # the running config (sil_capacity, sil_trigger, ...) wins over the checkpoint's
        self.buffer.set_state(state, keep_config=True)
