"""The registry of rollout pipelines: the one list of ``rollout_pipeline`` names.

``GRPOConfig.validate()`` checks a name against it and asks the pipeline's ``config_problems``;
``GRPO.setup`` builds the run's pipeline with :func:`make_pipeline`. A pipeline of your own::

    from rllib_spear.pipelines import RolloutPipeline, register_pipeline

    @register_pipeline("my_pipeline")
    class MyPipeline(RolloutPipeline):
        @classmethod
        def from_config(cls, config): return cls()
        def next_batch(self, host): ...

    GRPOConfig().training(rollout_pipeline="my_pipeline")

``rllib_spear.testing.check_pipeline_contract("my_pipeline")`` checks it as the built-ins are.
"""
from __future__ import annotations

from typing import Any, Callable

from ..registry import Registry
from .base import RolloutPipeline

__all__ = ["PIPELINES", "register_pipeline", "get_pipeline", "pipeline_names", "make_pipeline"]

PIPELINES: Registry[type[RolloutPipeline]] = Registry(
    "rollout pipeline", register_hint="rllib_spear.pipelines.register_pipeline")


def register_pipeline(name: str, *, override: bool = False) -> Callable[[type[RolloutPipeline]], type[RolloutPipeline]]:
    """Class decorator: register a :class:`RolloutPipeline` subclass as ``rollout_pipeline=name``."""
    def add(cls: type[RolloutPipeline]) -> type[RolloutPipeline]:
        if not (isinstance(cls, type) and issubclass(cls, RolloutPipeline)):
            raise TypeError(f"register_pipeline({name!r}) takes a RolloutPipeline subclass, got {cls!r}")
        PIPELINES.register(name, cls, override=override)
        cls.name = name
        return cls

    return add


def get_pipeline(name: str) -> type[RolloutPipeline]:
    """The pipeline class registered as ``name`` (ValueError naming the choices otherwise)."""
    return PIPELINES.get(name)


def pipeline_names() -> list[str]:
    """The registered names, in registration order (the built-ins: sync, one_step_off, async)."""
    return list(PIPELINES.view())


def make_pipeline(config: Any) -> RolloutPipeline:
    """The pipeline of a run of ``config`` (``config.rollout_pipeline``)."""
    return get_pipeline(config.rollout_pipeline).from_config(config)
