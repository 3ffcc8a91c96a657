"""SPADERConfig: step-wise peer advantage + diversity-aware step rewards (docs/algorithms.md 3)."""
from __future__ import annotations

from ..grpo.config import GRPOConfig


class SPADERConfig(GRPOConfig):
    """SPADER defaults (3.4): PPO clip 0.2/0.2, token-mean, SPA advantages (gamma 0.9), the
    diversity reward with a delayed tool cost (``reward_shapers=("spader_diversity",)``), lr 1e-5
    with warmup, no entropy bonus, no filters. SIL and SPEAR's tool-call bonus are off and can be
    switched on: ``.training(sil_enabled=True, reward_shapers=("spader_diversity", "tool_call_bonus"))``."""

    def __init__(self, algo_class: type | None = None) -> None:
        if algo_class is None:
            from .spader import SPADER

            algo_class = SPADER
        super().__init__(algo_class=algo_class)
        self.advantage_estimator = "spa"
        self.spa_gamma = 0.9
        self.std_normalize_advantages = True
        self.reward_shapers = ("spader_diversity",)
        self.kl_coeff = 0.0  # option: 0.001 with kl_estimator "k3" (frozen reference model)
        self.kl_estimator = "k3"
        self.lr = 1e-5
        self.lr_warmup_steps = 10  # 5% of 200 steps
        self.group_size = 16
        self.tasks_per_iteration = 32
        self.max_turns = 16
        self.env = "multi_answer_search"
