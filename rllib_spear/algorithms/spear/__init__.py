"""SPEAR: SPEARConfig and SPEAR (the replay buffer lives in rllib_spear.recipe.sil_buffer)."""
from ...recipe.sil_buffer import SILReplayBuffer

__all__ = ["SILReplayBuffer", "SPEARConfig", "SPEAR"]


def __getattr__(name):  # lazy: the buffer must import without building RLlib algorithms
    if name == "SPEARConfig":
        from .config import SPEARConfig
        return SPEARConfig
    if name == "SPEAR":
        from .spear import SPEAR
        return SPEAR
    raise AttributeError(name)
