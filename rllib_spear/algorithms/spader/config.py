"""SPADERConfig: step-wise peer advantage + diversity-aware step rewards (docs/algorithms.md 3)."""
from __future__ import annotations

from typing import Any

from ..spear.config import SPEAR_TRAINING_DEFAULTS, SPEARConfig
from ..grpo.config import GRPO_TRAINING_DEFAULTS

SPADER_TRAINING_DEFAULTS: dict[str, Any] = {
    "diversity_alpha": 1.0,
    "diversity_beta": 4.0,
    "diversity_lambda": 1.0,
    "tool_round_cost": 0.01,
    "cost_free_steps": 100,  # the Llama script used 200
    "cost_rampup_steps": 100,
    "final_answer_weight": 1.0,
    "format_error_reward": 0.0,  # released code; the paper's figure says -1
}


class SPADERConfig(SPEARConfig):
    """SPADER defaults (3.4): PPO clip 0.2/0.2, token-mean, SPA advantages (gamma 0.9),
    diversity reward with a delayed tool cost, lr 1e-5 with warmup, no entropy bonus, no SIL
    and no tool-call bonus (both can be switched on: ``.training(sil_enabled=True)``)."""

    def __init__(self, algo_class: type | None = None) -> None:
        if algo_class is None:
            from .spader import SPADER

            algo_class = SPADER
        super().__init__(algo_class=algo_class)
        self.clip_ratio_low = 0.2
        self.clip_ratio_high = 0.2
        self.dual_clip_c = None
        self.loss_agg_mode = "token-mean"
        self.loss_mode = "vanilla"
        self.std_normalize_advantages = True
        self.advantage_estimator = "spa"
        self.spa_gamma = 0.9
        self.response_filters = ()
        self.group_filter_keep_fraction = None
        self.entropy_coeff = 0.0
        self.kl_coeff = 0.0  # option: 0.001 with kl_estimator "k3" (frozen reference model)
        self.kl_estimator = "k3"
        self.lr = 1e-5
        self.lr_warmup_steps = 10  # 5% of 200 steps
        self.tool_reward_schedule = "none"
        self.sil_enabled = False
        self.group_size = 16
        self.tasks_per_iteration = 32
        self.max_turns = 16
        self.env = "multi_answer_search"
        for k, v in SPADER_TRAINING_DEFAULTS.items():
            setattr(self, k, v)

    @classmethod
    def _own_training_keys(cls) -> set[str]:
        return set(GRPO_TRAINING_DEFAULTS) | set(SPEAR_TRAINING_DEFAULTS) | set(SPADER_TRAINING_DEFAULTS)

    def validate(self) -> None:
        super().validate()
        err = self._value_error
        for name in ("diversity_alpha", "diversity_beta", "diversity_lambda", "tool_round_cost",
                     "final_answer_weight"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or v < 0:
                err(f"`{name}` must be a number >= 0, got {v!r}")
        for name in ("cost_free_steps", "cost_rampup_steps"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                err(f"`{name}` must be an integer >= 0, got {v!r}")
        if self.format_error_reward not in (0, 0.0, -1, -1.0):
            err(f"`format_error_reward` must be 0 (released code) or -1 (paper), got {self.format_error_reward!r}")
