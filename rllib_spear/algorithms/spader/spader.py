"""SPADER as an RLlib Algorithm: the GRPO training step with SPADER's recipe (docs/algorithms.md 3).

Rewards per trajectory i and step k (3.2) come from the registered ``spader_diversity`` reward
shaper; advantages per group and step index (3.3) from the ``spa`` estimator
(rllib_spear/recipe). SIL and the tool-call bonus can be switched on in the config.
"""
from __future__ import annotations

from ..grpo.grpo import GRPO
from .config import SPADERConfig

__all__ = ["SPADER"]


class SPADER(GRPO):
    """Step-wise Peer Advantage with Diversity-aware Exploration Rewards."""

    @classmethod
    def get_default_config(cls) -> SPADERConfig:
        return SPADERConfig()
