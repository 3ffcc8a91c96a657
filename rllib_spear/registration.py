"""Tune registration: ``tune.run("SPEAR", ...)`` / ``tune.Tuner("SPADER", ...)`` after
``import rllib_spear`` (RLlib's own registry is a hard-coded dict without entry points)."""
from __future__ import annotations

ALGORITHM_NAMES = ("GRPO-LLM", "DrBoT", "SPEAR", "SPADER")


def algorithm_classes() -> dict[str, type]:
    from .algorithms.grpo import GRPO, DrBoT
    from .algorithms.spader.spader import SPADER
    from .algorithms.spear.spear import SPEAR

    return {"GRPO-LLM": GRPO, "DrBoT": DrBoT, "SPEAR": SPEAR, "SPADER": SPADER}


def register_all() -> None:
    """Register every algorithm with Tune under its public name."""
    from ray.tune.registry import register_trainable

    for name, cls in algorithm_classes().items():
        register_trainable(name, cls)
