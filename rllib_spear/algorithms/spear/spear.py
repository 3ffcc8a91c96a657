"""SPEAR as an RLlib Algorithm: Dr.BoT + tool-call bonus (decaying) + SIL replay (rising)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ...core.advantages import group_reward_stats
from ...core.schedules import sil_weight, tool_call_bonus, tool_reward_weight
from ...core.trajectory import Trajectory
from ..grpo.batching import LearnerRow
from ..grpo.grpo import GRPO
from .config import SPEARConfig
from .sil_buffer import SILReplayBuffer

__all__ = ["SPEAR"]


class SPEAR(GRPO):
    """Self-imitation with progressive exploration (docs/algorithms.md 2)."""

    @classmethod
    def get_default_config(cls) -> SPEARConfig:
        return SPEARConfig()

    def setup(self, config: SPEARConfig) -> None:
        super().setup(config)
        self.sil_buffer = self._make_buffer(config) if getattr(config, "sil_enabled", False) else None
        self._last_tool_weight = 0.0
        self._last_sil_weight = 0.0

    @staticmethod
    def _make_buffer(config: SPEARConfig) -> SILReplayBuffer:
        return SILReplayBuffer(
            capacity=config.sil_capacity, tolerate_steps=config.sil_tolerate_steps,
            baseline_buffer_size=config.sil_baseline_buffer_size, trigger=config.sil_trigger,
            replay_batch_size=config.sil_replay_batch_size, std_normalize=config.sil_std_normalize,
            keep_zero=config.sil_keep_zero, require_tool_call=config.sil_require_tool_call,
            min_replay_size=config.sil_min_replay_size, seed=int(config.seed or 0),
        )

    # -- 2.1 tool-call bonus: R_i = r_outcome + lambda_tool(t) * r_tool
    def shape_rewards(self, trajs: list[Trajectory], step: int) -> None:
        super().shape_rewards(trajs, step)
        cfg = self.config
        lam = tool_reward_weight(step, cfg.tool_reward_schedule, cfg.tool_reward_steps)
        self._last_tool_weight = lam
        for t in trajs:
            n = int(t.info.get("tool_calls", 0) or 0)
            if cfg.tool_reward_variant == "qwen3" and t.info.get("success"):
                r_tool = float(n > 0)
            else:
                r_tool = tool_call_bonus(n, cfg.tool_reward_per_call, cfg.tool_reward_cap)
            t.rewards["tool_bonus"] = lam * r_tool

    # -- 2.2/2.3 replay: (a) sample before this step's batch is added
    def replay_rows(self, step: int) -> tuple[list[LearnerRow], bool]:
        cfg = self.config
        self._last_sil_weight = sil_weight(step, cfg.sil_kappa, cfg.sil_weight_steps)
        if self.sil_buffer is None:
            return [], False
        replay = self.sil_buffer.sample_replay(step)
        rows = [LearnerRow(t, t.token_advantages(float(a)), t.loss_mask(), is_replay=True,
                           loss_weight=self._last_sil_weight) for t, a in replay]
        return rows, cfg.sil_update == "joint"

    # -- (b)+(c): evict stale, record baselines, admit positive-advantage trajectories
    def after_update(self, trajs: list[Trajectory], episode_adv: np.ndarray,
                     filtered: list[bool], step: int) -> None:
        super().after_update(trajs, episode_adv, filtered, step)
        m = {"tool_reward_weight": self._last_tool_weight, "sil_weight": self._last_sil_weight}
        if self.sil_buffer is not None:
            stats = group_reward_stats([t.total_reward for t in trajs], [t.uid for t in trajs])
            means = [v[0] for v in stats.values()]
            stds = [v[1] for v in stats.values()]
            self.sil_buffer.add_batch(trajs, [float(a) for a in episode_adv], step,
                                      group_means=means, group_stds=stds,
                                      loss_masks_zeroed=filtered)
            m.update({f"sil_{k}": float(v) for k, v in self.sil_buffer.metrics().items()})
        for k, v in m.items():
            self.metrics.log_value(("spear", k), v, window=1)

    def _extra_state(self) -> dict[str, Any]:
        s = super()._extra_state()
        s["sil_buffer"] = None if self.sil_buffer is None else self.sil_buffer.get_state()
        return s

    def _set_extra_state(self, s: dict[str, Any]) -> None:
        super()._set_extra_state(s)
        if s.get("sil_buffer") is not None and self.sil_buffer is not None:
            self.sil_buffer.set_state(s["sil_buffer"])
