"""SPEARConfig: Dr.BoT + tool-call reward curriculum + SIL replay + Clip-Cov (docs/algorithms.md 2)."""
from __future__ import annotations

from ..grpo.config import GRPOConfig, apply_drbot_defaults


class SPEARConfig(GRPOConfig):
    """Config of SPEAR: the Dr.BoT recipe (clip-higher 0.28, dual clip 10, no std norm,
    seq-mean-token-sum-norm, filters) with Clip-Cov (1.4), the decaying tool-call bonus
    (``reward_shapers=("tool_call_bonus",)``, 2.1) and burst SIL (``sil_enabled=True``, 2.2-2.3).
    Each piece's knobs (``tool_reward_*``, ``sil_*``, ``replay_clip_cov_*``) are ``training()``
    kwargs; their defaults are the released agent settings. The SIL buffer is RLlib's
    ``replay_buffer_config`` (``{"type": "SILReplayBuffer" | a class | "pkg.module:Class",
    "capacity": ..., ...}``; the ``sil_*`` keys fill the knobs it leaves out), held as
    ``algo.local_replay_buffer`` and checkpointed with ``store_buffer_in_checkpoints=True``
    (docs/algorithms.md 2.6)."""

    def __init__(self, algo_class: type | None = None) -> None:
        if algo_class is None:
            from .spear import SPEAR

            algo_class = SPEAR
        super().__init__(algo_class=algo_class)
        apply_drbot_defaults(self)
        self.loss_mode = "clip_cov"
        self.entropy_coeff = 0.001
        self.reward_shapers = ("tool_call_bonus",)
        self.sil_enabled = True
