"""SPEARConfig: Dr.BoT + tool-call reward curriculum + SIL replay + Clip-Cov (docs/algorithms.md 2)."""
from __future__ import annotations

import dataclasses
from typing import Any

from ...core.losses import PolicyLossConfig
from ..grpo.config import GRPO_TRAINING_DEFAULTS, GRPOConfig, apply_drbot_defaults

SPEAR_TRAINING_DEFAULTS: dict[str, Any] = {
    # 2.1 intrinsic tool-call reward
    "tool_reward_schedule": "cosine",  # "none" | "constant" | "cosine"
    "tool_reward_steps": 200,  # T_tool
    "tool_reward_per_call": 0.1,
    "tool_reward_cap": 1.0,
    "tool_reward_variant": "posneg",  # "posneg" (both signs) | "qwen3" (indicator on correct)
    # 2.2 replay buffer
    "sil_enabled": True,
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


class SPEARConfig(GRPOConfig):
    """Config of SPEAR. Defaults: Dr.BoT (clip-higher 0.28, dual clip 10, no std norm,
    seq-mean-token-sum-norm, filters) + Clip-Cov + cosine tool reward + burst SIL."""

    def __init__(self, algo_class: type | None = None) -> None:
        if algo_class is None:
            from .spear import SPEAR

            algo_class = SPEAR
        super().__init__(algo_class=algo_class)
        apply_drbot_defaults(self)
        self.loss_mode = "clip_cov"
        self.entropy_coeff = 0.001
        for k, v in SPEAR_TRAINING_DEFAULTS.items():
            setattr(self, k, v)

    @classmethod
    def _own_training_keys(cls) -> set[str]:
        return set(GRPO_TRAINING_DEFAULTS) | set(SPEAR_TRAINING_DEFAULTS)

    def policy_loss_config(self, replay: bool = False) -> PolicyLossConfig:
        cfg = super().policy_loss_config(replay)
        if replay and cfg.loss_mode == "clip_cov":
            cfg = dataclasses.replace(cfg, clip_cov_ratio=self.replay_clip_cov_ratio,
                                      clip_cov_lb=self.replay_clip_cov_lb,
                                      clip_cov_ub=self.replay_clip_cov_ub)
        if replay:
            # ratio pi_theta / pi_behaviour against the stored log-probs: no engine term
            cfg = dataclasses.replace(cfg, tis_cap=None)
        return cfg

    def policy_loss_kwargs(self, replay: bool = False) -> dict[str, str]:
        names = super().policy_loss_kwargs(replay)
        if replay and self.loss_mode == "clip_cov":
            names.update(clip_cov_ratio="replay_clip_cov_ratio", clip_cov_lb="replay_clip_cov_lb",
                         clip_cov_ub="replay_clip_cov_ub")
        return names

    def validate(self) -> None:
        super().validate()
        err = self._value_error
        if self.tool_reward_schedule not in ("none", "constant", "cosine"):
            err(f"`tool_reward_schedule` must be 'none', 'constant' or 'cosine', got {self.tool_reward_schedule!r}")
        if self.tool_reward_variant not in ("posneg", "qwen3"):
            err(f"`tool_reward_variant` must be 'posneg' or 'qwen3', got {self.tool_reward_variant!r}")
        if self.sil_trigger not in ("burst", "continuous"):
            err(f"`sil_trigger` must be 'burst' or 'continuous', got {self.sil_trigger!r}")
        if self.sil_update not in ("sequential", "joint"):
            err(f"`sil_update` must be 'sequential' or 'joint', got {self.sil_update!r}")
        if not (0 <= self.sil_tolerate_steps <= 10):
            err(f"`sil_tolerate_steps` must be in [0, 10] (the released code clamps at 10), got {self.sil_tolerate_steps!r}")
        for name in ("tool_reward_steps", "sil_weight_steps", "sil_capacity", "sil_baseline_buffer_size",
                     "sil_replay_batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                err(f"`{name}` must be an integer >= 1, got {v!r}")
        for name in ("tool_reward_per_call", "tool_reward_cap", "sil_kappa"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or v < 0:
                err(f"`{name}` must be a number >= 0, got {v!r}")
