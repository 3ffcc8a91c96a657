"""SPEAR: SPEARConfig and SPEAR (the replay buffer lives in rllib_spear.recipe.sil_buffer)."""
from ...recipe.sil_buffer import SILBatch, SILReplayBuffer, register_with_rllib

__all__ = ["SILReplayBuffer", "SILBatch", "SPEARConfig", "SPEAR"]

# This package is the Ray side (``import rllib_spear`` imports it): from here on SILReplayBuffer is
# an RLlib ReplayBufferInterface for isinstance / issubclass (docs/algorithms.md 2.6).
register_with_rllib()


def __getattr__(name):  # lazy: the buffer must import without building RLlib algorithms
    if name == "SPEARConfig":
        from .config import SPEARConfig
        return SPEARConfig
    if name == "SPEAR":
        from .spear import SPEAR
        return SPEAR
    raise AttributeError(name)
