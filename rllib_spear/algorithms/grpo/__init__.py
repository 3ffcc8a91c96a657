"""GRPO and Dr.BoT baselines: the shared config and algorithm (the learner: ``rllib_spear.learner``).

Imports are lazy (module ``__getattr__``): ``GRPOConfig``, ``GRPO``, ``DrBoTConfig`` and ``DrBoT``
load RLlib on first use, so that importing the package needs no Ray (benchmarks/gpu_learner_check.py
runs on a machine that has no Ray).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from .config import DrBoTConfig, GRPOConfig
    from .grpo import GRPO, DrBoT

_EXPORTS = {"GRPOConfig": "config", "DrBoTConfig": "config", "GRPO": "grpo", "DrBoT": "grpo"}

__all__ = ["GRPOConfig", "GRPO", "DrBoTConfig", "DrBoT"]


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
