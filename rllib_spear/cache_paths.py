"""Where the library caches what it builds: ``$RLLIB_SPEAR_CACHE``, else ``~/.cache/rllib_spear``.

One root for every cache (the embedded datasets under ``data/``, BM25 indexes under ``bm25/``,
the tiny and cold-start models, benchmark models), so one variable moves them all. Pure Python.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """``$RLLIB_SPEAR_CACHE`` or ``~/.cache/rllib_spear``."""
    return Path(os.environ.get("RLLIB_SPEAR_CACHE") or Path.home() / ".cache" / "rllib_spear")
