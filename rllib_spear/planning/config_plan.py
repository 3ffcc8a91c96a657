"""The memory plan of a config (``rllib-spear plan``): :func:`plan` reads a GRPOConfig's model
(``model_config_for``), ``learners()``, ``env_runners()``, ``resources(colocate=...)`` and
``training(micro_batch_token_budget)`` into layouts and plans them; :func:`check_fits` is the check
``GRPOConfig.validate()`` runs when ``.learners(gpu_memory_gb=...)`` (or
``.env_runners(engine_gpu_memory_gb=...)``) is declared, refusing a config that cannot fit and
naming the knob to change. Pure Python (no torch, no Ray at import)."""
from __future__ import annotations

from typing import Any

from ..models.shapes import ModelShape, model_config_for
from .colocate import SYNC_DEVICE_BUCKETS, plan_colocated
from .fixes import plan_problems
from .layouts import (
    COLOCATED_GPU_MEMORY_UTILIZATION,
    MEMORY_ERROR,
    VLLM_GPU_MEMORY_UTILIZATION,
    VLLM_MAX_NUM_BATCHED_TOKENS,
    VLLM_MAX_NUM_SEQS,
    EngineLayout,
    LearnerLayout,
)
from .memory_plan import MemoryPlan, plan_memory

__all__ = ["plan", "check_fits", "check_cpu_learner_memory", "learner_sequence_length"]


def _planned_precision(config: Any, model_config: dict) -> str | None:
    """``mixed_precision`` as the learners will resolve it: "auto" is bf16 on GPU learners
    (assumed from the driver, which may hold no GPU) and on a CPU with bf16 in hardware
    (this machine's, where CPU learners usually run; models/precision.py)."""
    from ..models.precision import resolve_mixed_precision

    setting = getattr(config, "mixed_precision", None)
    if setting not in (None, "bf16", "auto"):
        return setting  # validate() names the bad value; the plan keeps it as written
    device_type = "cuda" if float(getattr(config, "num_gpus_per_learner", 0) or 0) > 0 else "cpu"
    native = True if device_type == "cuda" else None
    try:
        return resolve_mixed_precision(setting, device_type=device_type,
                                       weight_dtype=str(model_config.get("dtype", "float32")), native_bf16=native)
    except ValueError:  # an unknown model dtype: validate() names it
        return None


def _layouts_of(config: Any) -> tuple[LearnerLayout, EngineLayout | None, dict]:
    """(learner layout, engine layout, extras) of a GRPOConfig (any object with its attributes)."""
    mc = dict(config.model_config or {})
    lora = mc.get("lora") or None
    act = getattr(config, "use_activation_checkpointing", None)
    if act is None:
        ac = getattr(config, "activation_checkpointing", None)
        act = bool(ac) if ac is not None else bool(mc.get("gradient_checkpointing", False))
    ddp_kwargs = getattr(config, "torch_ddp_kwargs", None) or {}
    layout = LearnerLayout(
        sharding=str(getattr(config, "sharding", "ddp")),
        num_learners=int(getattr(config, "num_learners", 0) or 0),
        mixed_precision=_planned_precision(config, mc),
        cpu_offload=bool(getattr(config, "cpu_offload", False)),
        activation_checkpointing=bool(act),
        weight_dtype=str(mc.get("dtype", "float32")),
        lora=dict(lora) if lora else None,
        reference_model=float(getattr(config, "kl_coeff", 0.0) or 0.0) > 0,
        ddp_bucket_view=bool(ddp_kwargs.get("gradient_as_bucket_view", False)),
        packed=getattr(config, "packed_microbatches", False) is True,
        attention=mc.get("attn_implementation") if isinstance(mc.get("attn_implementation"), str) else None,
    )
    ek = dict(getattr(config, "engine_kwargs", None) or {})
    colocate = bool(getattr(config, "colocate", False))
    # a colocated vLLM runner's default share (env_runners/placement.py runner_engine_kwargs)
    default_util = COLOCATED_GPU_MEMORY_UTILIZATION if colocate else VLLM_GPU_MEMORY_UTILIZATION
    runners = max(1, int(getattr(config, "num_env_runners", 1) or 0))
    engine_name = str(getattr(config, "engine", "vllm"))
    default_dtype = mc.get("dtype", "float32") if engine_name == "hf" else "float32"
    rollouts = int(getattr(config, "tasks_per_iteration", 0) or 0) * int(getattr(config, "group_size", 0) or 0)
    engine = EngineLayout(
        engine=engine_name,
        num_runners=runners,
        gpus_per_runner=float(getattr(config, "num_gpus_per_env_runner", 0) or 0),
        tensor_parallel=int(ek.get("tensor_parallel_size", 1)),
        dtype=str(ek.get("dtype", default_dtype)),
        kv_dtype=ek.get("kv_cache_dtype") if ek.get("kv_cache_dtype") not in (None, "auto") else None,
        gpu_memory_utilization=float(ek.get("gpu_memory_utilization", default_util)),
        max_model_len=int(ek.get("max_model_len", getattr(config, "max_model_len", 1024))),
        max_num_batched_tokens=int(ek.get("max_num_batched_tokens", VLLM_MAX_NUM_BATCHED_TOKENS)),
        max_num_seqs=int(ek.get("max_num_seqs", VLLM_MAX_NUM_SEQS)),
        rollouts_per_runner=-(-rollouts // runners) if rollouts else 0,
    )
    extras = {"chunk_size": mc.get("logprob_chunk_size"), "engine_kwargs": ek,
              "learner_on_gpu": float(getattr(config, "num_gpus_per_learner", 0) or 0) > 0}
    return layout, engine, extras


def learner_sequence_length(config: Any) -> int:
    """The longest sequence a learner trains on: ``max_model_len`` (one episode) in the full
    layout; in the window layout (``step_context="window"``, docs/design.md "Sample layouts: full
    and window") one step sample, ``max_prompt_tokens + max_new_tokens`` (capped by
    ``max_model_len``; ``max_prompt_tokens`` None: ``max_model_len``)."""
    total = int(config.max_model_len)
    if getattr(config, "step_context", "full") != "window":
        return total
    prompt = getattr(config, "max_prompt_tokens", None)
    return min(total, (total if prompt is None else int(prompt)) + int(getattr(config, "max_new_tokens", 0) or 0))


def plan(config: Any, *, host_memory_gb: float | None = None) -> MemoryPlan:
    """The memory plan of a GRPOConfig (or SPEAR/SPADER config): its model (``model_config_for``),
    ``learners()``, ``env_runners()`` and ``training(micro_batch_token_budget)``; with
    ``host_memory_gb`` (``rllib-spear plan --host-memory-gb``), the verdict also checks the pinned
    CPU RAM of ``cpu_offload`` per learner node against it."""
    # "embedded": the shipped cold start's config.json; a named cold start ("smollm2-tools"): its
    # model's bundled config, so that sizing it never builds it
    from ..coldstart.lookup import NAMED_COLD_START_SHAPES, resolve_model_path

    mc = dict(config.model_config or {})
    path = str(mc.get("model_path", ""))
    cfg_json, name, source = model_config_for(NAMED_COLD_START_SHAPES.get(path, path), resolve=resolve_model_path)
    if path in NAMED_COLD_START_SHAPES:
        name, source = path, f"{source}, the model of the cold start {path!r}"
    shape = ModelShape.from_config(cfg_json, name)
    layout, engine, extras = _layouts_of(config)
    gpu = getattr(config, "gpu_memory_gb", None)
    eng_gpu = getattr(config, "engine_gpu_memory_gb", None)
    seq_len = learner_sequence_length(config)  # the learner's rows: an episode, or one step sample
    out = plan_memory(shape, layout, micro_batch_token_budget=int(config.micro_batch_token_budget),
                      max_model_len=seq_len, gpu_memory_gb=gpu, engine=engine,
                      engine_gpu_memory_gb=eng_gpu, chunk_size=extras["chunk_size"], model_source=source,
                      learner_on_gpu=extras["learner_on_gpu"], host_memory_gb=host_memory_gb)
    if getattr(config, "step_context", "full") == "window":
        out.notes.append(f"step_context='window': the learners train one sample per step, at most {seq_len} tokens "
                         "(max_prompt_tokens + max_new_tokens), the learner's max_model_len above")
    if getattr(config, "colocate", False) and extras["learner_on_gpu"] and out.engine is not None:
        bucket = SYNC_DEVICE_BUCKETS * int(float(getattr(config, "weight_sync_bucket_mb", 0) or 0) * 2**20)
        out.colocated = plan_colocated(out.learner, out.engine, out.gpu_memory_gb,
                                       sleep_level=int(getattr(config, "colocate_sleep_level", 1)),
                                       bucket_bytes=bucket)
    if (engine.engine == "vllm" and engine.gpus_per_runner and engine.tensor_parallel > engine.gpus_per_runner
            and out.colocated is None):  # (a colocated runner holds its GPU share, not a whole GPU)
        out.notes.append(f"tensor_parallel_size={engine.tensor_parallel} needs num_gpus_per_env_runner="
                         f"{engine.tensor_parallel} (got {engine.gpus_per_runner:g})")
    return out


def check_cpu_learner_memory(config: Any, *, available_gb: float | None = None) -> str | None:
    """CPU learners (``num_gpus_per_learner=0``): the message of ``cpu_learner_host_fixes`` when
    their planned peak exceeds ``available_gb`` (default: this machine's available RAM), else
    None. None too for GPU learners, for the embedded cold starts (a few MB, and resolving
    "embedded:<task>" may build one) and for a model the planner cannot size."""
    if float(getattr(config, "num_gpus_per_learner", 0) or 0) > 0:
        return None
    from ..coldstart.lookup import is_embedded_name
    from .fixes import cpu_learner_host_fixes
    from .memory_plan import available_host_memory_gb

    if is_embedded_name(str((config.model_config or {}).get("model_path", ""))):
        return None
    host = available_host_memory_gb() if available_gb is None else available_gb
    if host is None:
        return None
    try:
        p = plan(config, host_memory_gb=host)
    except (ValueError, OSError):  # no shape for the model: nothing to check against
        return None
    return cpu_learner_host_fixes(p) if p.host_fits is False else None


def check_fits(config: Any, *, raise_error: bool = False) -> str | None:
    """None when the config fits (or declares no GPU memory); else the message naming the knobs
    to change (``ValueError`` with it when ``raise_error``)."""
    if getattr(config, "gpu_memory_gb", None) is None and getattr(config, "engine_gpu_memory_gb", None) is None:
        return None
    p = plan(config)
    problems = plan_problems(p)
    if not problems:
        return None
    msg = f"{MEMORY_ERROR} " + "\n".join(problems) + "\n(run `rllib-spear plan CONFIG.yaml` for the full table)"
    if raise_error:
        raise ValueError(msg)
    return msg

