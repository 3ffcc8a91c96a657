"""Tune registration: ``tune.run("SPEAR", ...)`` / ``tune.Tuner("SPADER", ...)`` after
``import rllib_spear`` (RLlib's own registry is a hard-coded dict without entry points)."""
from __future__ import annotations

ALGORITHM_NAMES = ("GRPO-LLM", "DrBoT", "SPEAR", "SPADER")


def algorithm_classes() -> dict[str, type]:
    from .algorithms.grpo import GRPO, DrBoT
    from .algorithms.spader.spader import SPADER
    from .algorithms.spear.spear import SPEAR

    return {"GRPO-LLM": GRPO, "DrBoT": DrBoT, "SPEAR": SPEAR, "SPADER": SPADER}


def ray_installed() -> bool:
    """Whether Ray can be found (``importlib.util.find_spec``), without importing it."""
    import importlib.util

    try:
        return importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):  # a finder that refuses it; a module without a spec
        return False


def register_all() -> bool:
    """Register every algorithm with Tune under its public name; True when done.

    Without Ray installed (a bare GPU machine: benchmarks/gpu_learner_check.py) there is nothing
    to register with: returns False, so that ``import rllib_spear`` still gives the Ray-free
    parts (core, models, planner, the learner's update core). An import error of an installed
    Ray (a broken install) is raised, not hidden."""
    try:
        from ray.tune.registry import register_trainable
    except ImportError:
        if ray_installed():
            raise
        return False
    for name, cls in algorithm_classes().items():
        register_trainable(name, cls)
    return True
