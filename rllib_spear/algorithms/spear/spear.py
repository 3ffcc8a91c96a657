"""SPEAR as an RLlib Algorithm: the GRPO training step with SPEAR's recipe (docs/algorithms.md 2).

Nothing here but the default config: the tool-call bonus is a registered reward shaper and SIL a
recipe feature (rllib_spear/recipe), so GRPO's ``training_step`` runs them when the config names them.
"""
from __future__ import annotations

from ..grpo.grpo import GRPO
from .config import SPEARConfig

__all__ = ["SPEAR"]


class SPEAR(GRPO):
    """Self-imitation with progressive exploration (docs/algorithms.md 2)."""

    @classmethod
    def get_default_config(cls) -> SPEARConfig:
        return SPEARConfig()
