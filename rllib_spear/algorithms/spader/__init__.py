"""SPADER: SPADERConfig and SPADER."""
from .config import SPADERConfig
from .spader import SPADER

__all__ = ["SPADERConfig", "SPADER"]
