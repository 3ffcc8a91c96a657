"""Where an LLMEnvRunner runs and what it asks Ray for (docs/design.md "Cluster placement").

RLlib creates every remote env runner with ``num_cpus_per_env_runner``,
``num_gpus_per_env_runner`` and ``custom_resources_per_env_runner`` (EnvRunnerGroup's actor
options, and one placement-group bundle per runner in ``Algorithm.default_resource_request``
under Tune). A vLLM engine with ``tensor_parallel_size`` k (times ``pipeline_parallel_size``)
runs k worker processes, one per GPU, inside that one runner: the runner must hold k GPUs.
``resolve_runner_gpus`` (called by ``GRPOConfig.validate()``) makes ``num_gpus_per_env_runner``
say so: left at 0 it becomes k; any other value than k is refused with the fix. With k = 1
nothing changes (``num_gpus_per_env_runner`` stays what the config says: 0 on CPU, 1 per GPU
engine in the shipped recipes).

``runner_engine_kwargs`` is what the runner passes to its engine: with k > 1 vLLM's executor
defaults to ``distributed_executor_backend="mp"`` (worker processes on the runner's own GPUs).
vLLM's own default would pick its Ray executor inside a placement group (Tune), whose worker
actors would wait for GPUs that the runner already holds.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

__all__ = ["engine_world_size", "required_runner_gpus", "resolve_runner_gpus", "runner_bundle",
           "runner_engine_kwargs"]


def _positive_int(engine_kwargs: Mapping[str, Any], key: str) -> int:
    v = engine_kwargs.get(key, 1)
    if v is None:
        return 1
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"`engine_kwargs['{key}']` must be an integer >= 1, got {v!r}")
    return int(v)


def engine_world_size(engine: str, engine_kwargs: Mapping[str, Any] | None) -> int:
    """GPUs one engine spans: vLLM's ``tensor_parallel_size x pipeline_parallel_size`` (1 for hf)."""
    ek = dict(engine_kwargs or {})
    if engine != "vllm":
        return 1
    return _positive_int(ek, "tensor_parallel_size") * _positive_int(ek, "pipeline_parallel_size")


def required_runner_gpus(engine: str, engine_kwargs: Mapping[str, Any] | None,
                         num_gpus_per_env_runner: float) -> float:
    """The ``num_gpus_per_env_runner`` a runner must request; raises ValueError (naming both knobs)
    when the given value conflicts with the engine's world size."""
    k = engine_world_size(engine, engine_kwargs)
    given = num_gpus_per_env_runner or 0
    if k == 1 or given == k:
        return given
    if given == 0:
        return k
    ek = dict(engine_kwargs or {})
    tp, pp = ek.get("tensor_parallel_size", 1), ek.get("pipeline_parallel_size", 1)
    raise ValueError(
        f"engine_kwargs tensor_parallel_size={tp}" + (f" x pipeline_parallel_size={pp}" if pp not in (None, 1) else "")
        + f" runs the runner's vLLM engine on {k} GPUs, but num_gpus_per_env_runner={given!r}: set "
        f".env_runners(num_gpus_per_env_runner={k}) (or leave it at 0 and it becomes {k}); each runner "
        f"then gets one placement-group bundle with {k} GPUs")


def resolve_runner_gpus(cfg: Any, err: Callable[[str], None]) -> None:
    """validate(): set ``cfg.num_gpus_per_env_runner`` to what the engine needs (see the module doc)."""
    try:
        gpus = required_runner_gpus(cfg.engine, cfg.engine_kwargs, cfg.num_gpus_per_env_runner)
    except ValueError as e:
        err(str(e))
        return
    if gpus != cfg.num_gpus_per_env_runner:  # (a validated, frozen config already holds it)
        cfg.num_gpus_per_env_runner = gpus


def runner_bundle(cfg: Any) -> dict[str, float]:
    """The resources of one remote env runner: RLlib's actor options and placement-group bundle."""
    return {"CPU": cfg.num_cpus_per_env_runner,
            "GPU": required_runner_gpus(cfg.engine, cfg.engine_kwargs, cfg.num_gpus_per_env_runner),
            **dict(cfg.custom_resources_per_env_runner or {})}


def runner_engine_kwargs(engine: str, engine_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """``engine_kwargs`` as the runner hands them to its engine: a multi-GPU vLLM engine runs its
    workers as processes on the runner's GPUs unless ``distributed_executor_backend`` is given."""
    ek = dict(engine_kwargs or {})
    if engine_world_size(engine, ek) > 1:
        ek.setdefault("distributed_executor_backend", "mp")
    return ek
