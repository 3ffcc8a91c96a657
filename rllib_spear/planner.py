"""Memory planner: what one learner GPU and one engine GPU need for a config (``rllib-spear plan``).

Pure Python (no torch, no Ray at import): ``GRPOConfig.validate()`` calls it when
``.learners(gpu_memory_gb=...)`` (or ``.env_runners(engine_gpu_memory_gb=...)``) is declared, and
refuses a config that cannot fit, naming the knob to change. docs/memory_planner.md derives every
term and compares them with measurements (benchmarks/planner_accuracy.py).

Per learner GPU, with P parameters (``models.shapes.ModelShape``), P_t trainable ones (P, or the
LoRA adapters), w bytes per stored weight (4 for float32 master weights, 2 for bf16 storage), and
s = ``num_learners`` under "fsdp" (1 under "ddp")::

    parameters     (P + adapters) * w / s
    gradients      P_t * w / s                    (+ P_t * w DDP gradient buckets with > 1 learner)
    AdamW state    2 * P_t * w / s                (exp_avg, exp_avg_sq in the weights' dtype)
    gathered       fsdp: 2 blocks gathered (current + prefetched) * c + one block's unsharded
                   gradients * (c + 4 for the float32 reduce-scatter when c = 2) + the root group
                   (embeddings, final norm, head; not resharded after forward) * c, and its
                   unsharded gradients * c; c = 2 under bf16, else w
    autocast copy  ddp + bf16: the bf16 copies of every matmul weight autocast caches in forward
                   (2 * linear weights)
    activations    ``activation_peak``: saved tensors (``models.activations``) + what lives beside
                   them at the backward's peak
    reference      kl_coeff > 0: a frozen copy of the policy, (P + adapters) * w / s (+ its gathered
                   root under fsdp)
    step temp      AdamW's foreach step: one temporary per exp_avg_sq (sqrt), P_t * w / s
    allowance      ``OVERHEAD_GIB`` for the CUDA context, NCCL/cuBLAS workspaces and allocator
                   fragmentation

    peak = parameters + gradients + AdamW + buckets + reference
           + max(gathered + autocast copy + activations, step temp) + allowance

``cpu_offload`` moves parameters, gradients, AdamW state and the step to CPU RAM (reported per
node, pinned; ``rllib-spear plan --host-memory-gb`` checks it against a node's RAM). Per engine GPU (vLLM): weights P * b / tp; KV cache = gpu_memory_utilization * G - weights -
the profile-run reserve, at 2 * layers * kv_heads/tp * head_dim * b bytes per token.

Colocated GPUs (``.resources(colocate=True)``: a learner rank and an engine per GPU, the engine
asleep while the learner trains): ``planning.colocate`` checks each phase of an iteration
(sampling, training, weight sync) against the one GPU, and the host copies of sleep level 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .models.activations import Precision, block_saved_bytes, saved_bytes  # noqa: F401
from .models.shapes import ModelShape, model_config_for
from .planning.colocate import ColocatedPlan, colocated_host_problem, colocated_problems, plan_colocated
from .planning.engine import EnginePlan, plan_engine
from .planning.layouts import (  # noqa: F401 - the planner's names stay importable from here
    _DTYPE_BYTES,
    COLOCATED_GPU_MEMORY_UTILIZATION,
    DEFAULT_CHUNK_ELEMENTS,
    GIB,
    GPUS_PER_NODE,
    MEMORY_ERROR,
    OVERHEAD_GIB,
    VLLM_FIXED_RESERVE_GIB,
    VLLM_GPU_MEMORY_UTILIZATION,
    VLLM_MAX_NUM_BATCHED_TOKENS,
    VLLM_MAX_NUM_SEQS,
    EngineLayout,
    LearnerLayout,
    _gib,
    dtype_bytes,
)
from .planning.learner import (  # noqa: F401
    ActivationPeak,
    LearnerPlan,
    _lora_args,
    activation_peak,
    alternative_layouts,
    packing_cases,
    plan_learner,
)

__all__ = [
    "GIB", "OVERHEAD_GIB", "LearnerLayout", "EngineLayout", "ActivationPeak", "LearnerPlan", "EnginePlan",
    "MemoryPlan", "activation_peak", "packing_cases", "plan_learner", "plan_engine", "plan_memory", "plan",
    "check_fits", "MEMORY_ERROR", "ColocatedPlan", "plan_colocated", "learner_sequence_length",
]


# ---------------------------------------------------------------------- the whole plan
@dataclass
class MemoryPlan:
    """The plan of one config: the chosen learner layout, its alternatives, the engine."""

    shape: ModelShape
    model_source: str
    learner: LearnerPlan
    alternatives: list[LearnerPlan]
    engine: EnginePlan | None
    gpu_memory_gb: float | None
    engine_gpu_memory_gb: float | None
    max_model_len: int
    notes: list[str] = field(default_factory=list)
    learner_on_gpu: bool = True
    chunk_size: int | None = None
    host_memory_gb: float | None = None  # host RAM of one learner node (GiB); None = not checked
    colocated: ColocatedPlan | None = None  # colocate=True: one learner rank and one engine per GPU

    @property
    def learner_fits(self) -> bool | None:
        return self.learner.fits(self.gpu_memory_gb) if self.learner_on_gpu else None

    @property
    def host_fits(self) -> bool | None:
        """Whether the pinned CPU RAM of ``cpu_offload`` fits in a learner node's host memory
        (None when nothing is offloaded or no host memory is declared)."""
        return self.learner.host_fits(self.host_memory_gb)

    @property
    def fits(self) -> bool | None:
        """False when a declared GPU or the declared host memory cannot hold it, True when every
        declared one can, None when no memory is declared."""
        verdicts = [v for v in (self.learner_fits, self.engine.fits if self.engine else None, self.host_fits)
                    if v is not None]
        c = self.colocated
        if c is not None:
            verdicts += [v for v in (c.fits, c.host_fits(self.host_memory_gb, self.learner.cpu_ram_per_node))
                         if v is not None]
        return None if not verdicts else all(verdicts)

    def problems(self) -> list[str]:
        """One message per part that does not fit, naming what to change."""
        from .planner_report import engine_fixes, host_fixes, learner_fixes

        out = []
        if self.colocated is not None:  # its phases replace the learner's and the engine's own checks
            out += colocated_problems(self)
            if self.host_fits is False:
                out.append(host_fixes(self))
            host = colocated_host_problem(self)
            return out + ([host] if host else [])
        if self.learner_fits is False:
            out.append(learner_fixes(self))
        if self.host_fits is False:
            out.append(host_fixes(self))
        if self.engine is not None and self.engine.fits is False:
            out.append(engine_fixes(self))
        return out

    def format(self) -> str:
        from .planner_report import format_plan

        return format_plan(self)


def plan_memory(shape: ModelShape, layout: LearnerLayout, *, micro_batch_token_budget: int, max_model_len: int,
                gpu_memory_gb: float | None = None, engine: EngineLayout | None = None,
                engine_gpu_memory_gb: float | None = None, chunk_size: int | None = None,
                model_source: str = "", learner_on_gpu: bool = True,
                host_memory_gb: float | None = None) -> MemoryPlan:
    """Plan ``layout`` and its alternatives (``alternative_layouts``) and the engine;
    ``host_memory_gb``: a learner node's RAM, checked against the pinned state of ``cpu_offload``."""
    kw = dict(micro_batch_token_budget=micro_batch_token_budget, max_model_len=max_model_len, chunk_size=chunk_size)
    chosen = plan_learner(shape, layout, **kw)
    alts = [chosen] + [plan_learner(shape, alt, **kw) for alt in alternative_layouts(layout)[1:]]
    eng_gib = engine_gpu_memory_gb if engine_gpu_memory_gb is not None else gpu_memory_gb
    eplan = plan_engine(shape, engine, eng_gib) if engine is not None else None
    return MemoryPlan(shape, model_source, chosen, alts, eplan, gpu_memory_gb, eng_gib, max_model_len,
                      learner_on_gpu=learner_on_gpu, chunk_size=chunk_size, host_memory_gb=host_memory_gb)


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
        mixed_precision=getattr(config, "mixed_precision", None),
        cpu_offload=bool(getattr(config, "cpu_offload", False)),
        activation_checkpointing=bool(act),
        weight_dtype=str(mc.get("dtype", "float32")),
        lora=dict(lora) if lora else None,
        reference_model=float(getattr(config, "kl_coeff", 0.0) or 0.0) > 0,
        ddp_bucket_view=bool(ddp_kwargs.get("gradient_as_bucket_view", False)),
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
    from .coldstart.lookup import resolve_model_path  # "embedded": the shipped cold start's config.json

    mc = dict(config.model_config or {})
    cfg_json, name, source = model_config_for(str(mc.get("model_path", "")), resolve=resolve_model_path)
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
        bucket = int(float(getattr(config, "weight_sync_bucket_mb", 0) or 0) * 2**20)
        out.colocated = plan_colocated(out.learner, out.engine, out.gpu_memory_gb,
                                       sleep_level=int(getattr(config, "colocate_sleep_level", 1)),
                                       bucket_bytes=bucket)
    if (engine.engine == "vllm" and engine.gpus_per_runner and engine.tensor_parallel > engine.gpus_per_runner
            and out.colocated is None):  # (a colocated runner holds its GPU share, not a whole GPU)
        out.notes.append(f"tensor_parallel_size={engine.tensor_parallel} needs num_gpus_per_env_runner="
                         f"{engine.tensor_parallel} (got {engine.gpus_per_runner:g})")
    return out


def check_fits(config: Any, *, raise_error: bool = False) -> str | None:
    """None when the config fits (or declares no GPU memory); else the message naming the knobs
    to change (``ValueError`` with it when ``raise_error``)."""
    if getattr(config, "gpu_memory_gb", None) is None and getattr(config, "engine_gpu_memory_gb", None) is None:
        return None
    p = plan(config)
    problems = p.problems()
    if not problems:
        return None
    msg = f"{MEMORY_ERROR} " + "\n".join(problems) + "\n(run `rllib-spear plan CONFIG.yaml` for the full table)"
    if raise_error:
        raise ValueError(msg)
    return msg

