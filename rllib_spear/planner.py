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
node). Per engine GPU (vLLM): weights P * b / tp; KV cache = gpu_memory_utilization * G - weights -
the profile-run reserve, at 2 * layers * kv_heads/tp * head_dim * b bytes per token.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from .models.activations import Precision, block_saved_bytes, saved_bytes
from .models.shapes import ModelShape, model_config_for

__all__ = [
    "GIB", "OVERHEAD_GIB", "LearnerLayout", "EngineLayout", "ActivationPeak", "LearnerPlan", "EnginePlan",
    "MemoryPlan", "activation_peak", "packing_cases", "plan_learner", "plan_engine", "plan_memory", "plan",
    "check_fits", "MEMORY_ERROR",
]

GIB = 2**30
#: Fixed allowance per GPU: CUDA context (~0.5-1 GiB), NCCL and cuBLAS workspaces (~1 GiB) and
#: caching-allocator fragmentation (~1.5 GiB); added to every learner total.
OVERHEAD_GIB = 3.0
#: Learner ranks per node, for the CPU RAM of ``cpu_offload``.
GPUS_PER_NODE = 8
#: float32 logits per head chunk (models/logprobs.py DEFAULT_CHUNK_ELEMENTS; copied: no torch here).
DEFAULT_CHUNK_ELEMENTS = 1 << 24
#: vLLM defaults assumed when engine_kwargs does not set them.
VLLM_GPU_MEMORY_UTILIZATION = 0.9
VLLM_MAX_NUM_BATCHED_TOKENS = 8192
VLLM_MAX_NUM_SEQS = 256
#: vLLM memory outside weights, KV cache and the profile activations: CUDA graphs and the
#: non-torch allocations it counts inside gpu_memory_utilization.
VLLM_FIXED_RESERVE_GIB = 1.0
#: The first words of validate()'s error when a config does not fit (the CLI recognises it).
MEMORY_ERROR = "memory plan:"

_DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2,
                "half": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def dtype_bytes(name: Any, default: int = 4) -> int:
    """Bytes per element of a dtype name ("bf16", "torch.float32", "auto" -> ``default``)."""
    if name is None or str(name) == "auto":
        return default
    key = str(name).replace("torch.", "").lower()
    if key not in _DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r} (one of {sorted(_DTYPE_BYTES)})")
    return _DTYPE_BYTES[key]


def _gib(b: float) -> float:
    return b / GIB


# ---------------------------------------------------------------------- layouts
@dataclass(frozen=True)
class LearnerLayout:
    """How the policy lies on the learners (``.learners()`` and the model_config keys that matter)."""

    sharding: str = "ddp"
    num_learners: int = 1
    mixed_precision: str | None = None
    cpu_offload: bool = False
    activation_checkpointing: bool = False
    weight_dtype: str = "float32"
    lora: Mapping[str, Any] | None = None
    reference_model: bool = False
    ddp_bucket_view: bool = False  # torch_ddp_kwargs gradient_as_bucket_view: no separate buckets

    @property
    def ranks(self) -> int:
        return max(1, int(self.num_learners))

    @property
    def fsdp(self) -> bool:
        return self.sharding == "fsdp"

    def label(self) -> str:
        parts = [f"{self.sharding} x{self.ranks}"]
        if self.cpu_offload:
            parts.append("offload")
        if self.activation_checkpointing:
            parts.append("AC")
        if self.lora:
            parts.append(f"LoRA r={self.lora.get('r', 8)}")
        return " + ".join(parts)

    def replace(self, **kw: Any) -> "LearnerLayout":
        return dataclasses.replace(self, **kw)


@dataclass(frozen=True)
class EngineLayout:
    """The generation engines (``.env_runners()``)."""

    engine: str = "vllm"
    num_runners: int = 1
    gpus_per_runner: float = 1
    tensor_parallel: int = 1
    dtype: str = "float32"
    kv_dtype: str | None = None
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION
    max_model_len: int = 1024
    max_num_batched_tokens: int = VLLM_MAX_NUM_BATCHED_TOKENS
    max_num_seqs: int = VLLM_MAX_NUM_SEQS
    rollouts_per_runner: int = 0  # sequences each runner samples per iteration (informative)

    def replace(self, **kw: Any) -> "EngineLayout":
        return dataclasses.replace(self, **kw)


# ---------------------------------------------------------------------- activations
@dataclass
class ActivationPeak:
    """Activation bytes of one learner GPU at the backward's peak, for one micro-batch.

    ``saved``: what autograd keeps (``models.activations.saved_bytes``); ``held`` (checkpointing):
    the cos/sin tables and the boolean mask the checkpoints reference; ``head``: the head phase,
    which comes first in backward: a chunk's logits plus about three float32 [rows, chunk, V]
    buffers of the fused log-softmax, or the logits gradient plus the chunk's fresh V x h weight
    gradient, whichever is larger, plus the head weight's summed gradient autograd holds until
    its last contribution and the full-length hidden-state gradient; ``recompute``
    (checkpointing) + ``workspace``: the block phase: one block's saved tensors while it is
    recomputed, the hidden-state gradients in and out and one i-wide intermediate gradient;
    ``autocast_weights``: the bf16 weight copies of autocast (not part of ``total``: the learner
    plan lists them apart)."""

    rows: int
    row_len: int
    padded: bool
    saved: int
    held: int
    recompute: int
    head: int
    workspace: int
    chunk_elements: int
    autocast_weights: int = 0

    @property
    def tokens(self) -> int:
        return self.rows * self.row_len

    @property
    def total(self) -> int:
        """saved + held + max(head phase, block phase): the head chunks' backward runs first, then
        each block's (recomputation and) backward."""
        return self.saved + self.held + max(self.head, self.recompute + self.workspace)


def _lora_args(shape: ModelShape, lora: Mapping[str, Any] | None) -> dict:
    if not lora:
        return {}
    return {"lora_targets": shape.lora_targets(lora.get("target_modules")), "lora_r": int(lora.get("r", 8)),
            "lora_dropout": float(lora.get("lora_dropout", 0.0) or 0.0) > 0}


def activation_peak(shape: ModelShape, prec: Precision, *, rows: int, row_len: int, checkpointing: bool,
                    lora: Mapping[str, Any] | None = None, full_finetune: bool | None = None,
                    chunk_size: int | None = None, padded: bool | None = None) -> ActivationPeak:
    """Activations of one ``rows`` x ``row_len`` micro-batch (see ``ActivationPeak``).

    Head chunk: ``chunk = chunk_size or max(1, DEFAULT_CHUNK_ELEMENTS // (rows * V))`` positions
    (models/logprobs.py), E = rows * min(chunk, row_len - 1) * V elements; with F = V * h * f the
    fresh gradient of a trained head per chunk (f = c bytes, + 4 under autocast: its cast to the
    float32 weight) and S = F when several chunks (or tied embeddings) make autograd hold a summed
    one, the head phase is max(E * (c + 12) + S, E * c + F + S) + tokens * h * x (x: the residual
    stream's bytes) and the block phase recompute + tokens * (2 * h * x + i * c) (+ F when tied)."""
    padded = rows > 1 if padded is None else padded
    full_finetune = not lora if full_finetune is None else full_finetune
    la = _lora_args(shape, lora)
    sb = saved_bytes(shape, prec, rows=rows, row_len=row_len, checkpointing=checkpointing, padded=padded, **la)
    tokens = rows * row_len
    cb = prec.compute_bytes
    x_bytes = prec.weight_bytes  # the residual stream keeps the embeddings' dtype
    held = recompute = 0
    if checkpointing:
        held = tokens * 2 * shape.head_dim * x_bytes + (tokens * row_len if padded else 0)
        # sized as a trained block even under LoRA: a frozen layer keeps less, but its backward
        # allocates the same input gradients (measured: LoRA's block phase is the full one's)
        recompute = block_saved_bytes(shape, prec, rows=rows, row_len=row_len, padded=padded).activations
    chunk = int(chunk_size) if chunk_size else max(1, DEFAULT_CHUNK_ELEMENTS // max(1, rows * shape.vocab))
    elems = rows * max(1, min(chunk, row_len - 1)) * shape.vocab
    # the chunk's logits + ~3 float32 buffers (log-softmax temporaries / its gradient), or, in the
    # head's own backward, the logits gradient + the chunk's fresh V x h weight gradient. Autograd
    # sums the contributions to one weight in the AccumulateGrad node's input buffer until the
    # last has arrived, so with several chunks (or a head tied to the embeddings, whose gradient
    # comes last) one V x h sum stays alive beside them.
    fresh = shape.vocab * shape.hidden * (cb + (4 if prec.autocast else 0)) if full_finetune else 0
    n_chunks = -(-(row_len - 1) // max(1, min(chunk, row_len - 1)))
    pending = fresh if (n_chunks > 1 or shape.tied) else 0
    head = max(elems * (cb + 12) + pending, elems * cb + fresh + pending)
    grad_hidden = tokens * shape.hidden * x_bytes
    # a block's backward: the hidden-state gradient in and out, and one i-wide intermediate
    # gradient (the block's saved tensors are freed as its backward goes, so no more coexist)
    workspace = tokens * (2 * shape.hidden * x_bytes + shape.intermediate * cb) + (fresh if shape.tied else 0)
    copies = 0
    if prec.autocast:
        if full_finetune:
            copies = 2 * shape.linear_weights  # cached (leaf weights that need grad) until forward ends
        else:
            # frozen weights are cast per call: kept for backward without checkpointing, else
            # one block's and the head's at a time
            copies = max(sb.weight_copies, 2 * (shape.block_linear_weights + shape.vocab * shape.hidden))
    return ActivationPeak(rows, row_len, padded, sb.activations, held, recompute, head + grad_hidden, workspace,
                          elems, copies)


def packing_cases(budget: int, max_len: int) -> list[tuple[int, int]]:
    """(rows, row length) micro-batches the learner's packing can produce (``len(part) x longest
    row <= budget``; a row longer than the budget forms its own part): full rows of
    min(max_len, budget); two or more padded rows of up to budget/2 (the per-layer mask bias grows
    with rows x length^2); one row of max_len when it exceeds the budget."""
    out = []
    t1 = max(1, min(max_len, budget))
    out.append((max(1, budget // t1), t1))
    t2 = min(max_len, budget // 2)
    if t2 >= 16 and (budget // t2, t2) not in out:
        out.append((budget // t2, t2))
    if max_len > budget:
        out.append((1, max_len))
    return out


# ---------------------------------------------------------------------- learner plan
@dataclass
class LearnerPlan:
    """Bytes per learner GPU of one layout (see the module docstring for the formulas)."""

    layout: LearnerLayout
    params: int
    grads: int
    optim: int
    buckets: int
    gathered: int
    autocast_copy: int
    activations: ActivationPeak
    reference: int
    step_temp: int
    overhead: int
    cpu_ram_per_rank: int = 0
    cpu_ram_per_node: int = 0
    micro_batch_token_budget: int = 0

    @property
    def persistent(self) -> int:
        return self.params + self.grads + self.optim + self.buckets + self.reference

    @property
    def fwd_bwd(self) -> int:
        return self.persistent + self.gathered + self.autocast_copy + self.activations.total

    @property
    def step(self) -> int:
        return self.persistent + self.step_temp

    @property
    def total(self) -> int:
        return max(self.fwd_bwd, self.step) + self.overhead

    def fits(self, gpu_gib: float | None) -> bool | None:
        return None if gpu_gib is None else _gib(self.total) <= gpu_gib


def plan_learner(shape: ModelShape, layout: LearnerLayout, *, micro_batch_token_budget: int, max_model_len: int,
                 chunk_size: int | None = None, gpus_per_node: int = GPUS_PER_NODE) -> LearnerPlan:
    """The per-GPU bytes of ``layout`` for micro-batches of ``micro_batch_token_budget`` tokens
    (the worst of ``packing_cases``)."""
    n = layout.ranks
    s = n if layout.fsdp else 1
    w = dtype_bytes(layout.weight_dtype)
    lora = dict(layout.lora) if layout.lora else None
    adapters = shape.lora_params(lora) if lora else 0
    p_all = shape.num_params + adapters
    p_train = adapters if lora else shape.num_params
    prec = Precision.of(weight_dtype_bytes=w, mixed_precision=layout.mixed_precision, sharded=layout.fsdp)
    offload = layout.fsdp and layout.cpu_offload
    params, grads, optim = p_all * w / s, p_train * w / s, 2 * p_train * w / s
    step_temp = p_train * w / s
    buckets = p_train * w if (not layout.fsdp and n > 1 and not layout.ddp_bucket_view) else 0
    gathered = 0.0
    reference = p_all * w / s if layout.reference_model else 0.0
    if layout.fsdp:
        c = prec.weight_bytes
        block = shape.block_params + adapters / shape.layers
        block_train = adapters / shape.layers if lora else shape.block_params
        root_train = 0 if lora else shape.root_params
        reduce_cast = 4 if c != w else 0  # bf16 unsharded grads cast to float32 for the reduce-scatter
        gathered = 2 * block * c + block_train * (c + reduce_cast) + shape.root_params * c + root_train * c
        if layout.reference_model:
            reference += shape.root_params * c  # its root stays gathered too
    cpu_rank = 0.0
    if offload:
        cpu_rank = params + grads + optim + step_temp + (p_all * w / s if layout.reference_model else 0)
        reference = shape.root_params * prec.weight_bytes if layout.reference_model else 0
        params = grads = optim = step_temp = 0
    acts = max((activation_peak(shape, prec, rows=r, row_len=t, checkpointing=layout.activation_checkpointing,
                                lora=lora, chunk_size=chunk_size)
                for r, t in packing_cases(micro_batch_token_budget, max_model_len)), key=lambda a: a.total + a.autocast_weights)
    return LearnerPlan(
        layout=layout, params=int(params), grads=int(grads), optim=int(optim), buckets=int(buckets),
        gathered=int(gathered), autocast_copy=acts.autocast_weights, activations=acts,
        reference=int(reference), step_temp=int(step_temp), overhead=int(OVERHEAD_GIB * GIB),
        cpu_ram_per_rank=int(cpu_rank), cpu_ram_per_node=int(cpu_rank * min(n, gpus_per_node)),
        micro_batch_token_budget=micro_batch_token_budget)


def alternative_layouts(layout: LearnerLayout) -> list[LearnerLayout]:
    """The layout itself and the alternatives the table compares: ddp / fsdp / fsdp + offload,
    each without and with activation checkpointing (and the full fine-tune ones beside LoRA)."""
    base = layout.replace(cpu_offload=False)
    out = [layout]
    loras = [layout.lora, None] if layout.lora else [None]
    for lora in loras:
        for sharding, offload in (("ddp", False), ("fsdp", False), ("fsdp", True)):
            for ac in (False, True):
                cand = base.replace(sharding=sharding, cpu_offload=offload, activation_checkpointing=ac, lora=lora)
                if cand not in out:
                    out.append(cand)
    return out


# ---------------------------------------------------------------------- engine plan
@dataclass
class EnginePlan:
    """One engine GPU: weights, the profile-run reserve and the KV cache left at
    ``gpu_memory_utilization``."""

    layout: EngineLayout
    weights: int
    reserve: int
    kv_bytes_per_token: int
    gpu_gib: float | None
    on_gpu: bool = True

    @property
    def kv_bytes(self) -> int | None:
        if self.gpu_gib is None or self.layout.engine != "vllm":
            return None
        return int(self.layout.gpu_memory_utilization * self.gpu_gib * GIB) - self.weights - self.reserve

    @property
    def kv_tokens(self) -> int | None:
        kv = self.kv_bytes
        return None if kv is None else max(0, kv) // self.kv_bytes_per_token

    @property
    def sequences(self) -> int | None:
        t = self.kv_tokens
        return None if t is None else t // self.layout.max_model_len

    @property
    def fits(self) -> bool | None:
        if self.gpu_gib is None or not self.on_gpu:
            return None
        if self.layout.engine != "vllm":
            return _gib(self.weights) + OVERHEAD_GIB <= self.gpu_gib
        return (self.sequences or 0) >= 1


def plan_engine(shape: ModelShape, layout: EngineLayout, gpu_gib: float | None) -> EnginePlan:
    """Weights per GPU P * b / tp; the vLLM reserve: the profile run's activations
    (max_num_batched_tokens x (3i/tp + 4h + (q + 2kv)/tp) x b), the sampler's float32 logits
    (2 x max_num_seqs x V x 4) and ``VLLM_FIXED_RESERVE_GIB``; the KV cache gets the rest of
    gpu_memory_utilization x G."""
    b = dtype_bytes(shape.dtype if str(layout.dtype) == "auto" else layout.dtype)  # vLLM "auto": the checkpoint's
    tp = max(1, int(layout.tensor_parallel))
    weights = shape.num_params * b // tp
    reserve = 0
    if layout.engine == "vllm":
        per_tok = 3 * shape.intermediate / tp + 4 * shape.hidden + (shape.q_width + 2 * shape.kv_width) / tp
        reserve = int(layout.max_num_batched_tokens * per_tok * b + 2 * layout.max_num_seqs * shape.vocab * 4
                      + VLLM_FIXED_RESERVE_GIB * GIB)
    kv_b = dtype_bytes(layout.kv_dtype, default=b) if layout.kv_dtype else b
    return EnginePlan(layout, int(weights), reserve, shape.kv_bytes_per_token(kv_b, tp), gpu_gib,
                      on_gpu=layout.gpus_per_runner > 0)


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

    @property
    def learner_fits(self) -> bool | None:
        return self.learner.fits(self.gpu_memory_gb) if self.learner_on_gpu else None

    @property
    def fits(self) -> bool | None:
        """False when a declared GPU cannot hold it, True when every declared one can, None when
        no GPU memory is declared."""
        verdicts = [v for v in (self.learner_fits, self.engine.fits if self.engine else None) if v is not None]
        return None if not verdicts else all(verdicts)

    def problems(self) -> list[str]:
        """One message per part that does not fit, naming what to change."""
        from .planner_report import engine_fixes, learner_fixes

        out = []
        if self.learner_fits is False:
            out.append(learner_fixes(self))
        if self.engine is not None and self.engine.fits is False:
            out.append(engine_fixes(self))
        return out

    def format(self) -> str:
        from .planner_report import format_plan

        return format_plan(self)


def plan_memory(shape: ModelShape, layout: LearnerLayout, *, micro_batch_token_budget: int, max_model_len: int,
                gpu_memory_gb: float | None = None, engine: EngineLayout | None = None,
                engine_gpu_memory_gb: float | None = None, chunk_size: int | None = None,
                model_source: str = "", learner_on_gpu: bool = True) -> MemoryPlan:
    """Plan ``layout`` and its alternatives (``alternative_layouts``) and the engine."""
    kw = dict(micro_batch_token_budget=micro_batch_token_budget, max_model_len=max_model_len, chunk_size=chunk_size)
    chosen = plan_learner(shape, layout, **kw)
    alts = [chosen] + [plan_learner(shape, alt, **kw) for alt in alternative_layouts(layout)[1:]]
    eng_gib = engine_gpu_memory_gb if engine_gpu_memory_gb is not None else gpu_memory_gb
    eplan = plan_engine(shape, engine, eng_gib) if engine is not None else None
    return MemoryPlan(shape, model_source, chosen, alts, eplan, gpu_memory_gb, eng_gib, max_model_len,
                      learner_on_gpu=learner_on_gpu, chunk_size=chunk_size)


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
        gpu_memory_utilization=float(ek.get("gpu_memory_utilization", VLLM_GPU_MEMORY_UTILIZATION)),
        max_model_len=int(ek.get("max_model_len", getattr(config, "max_model_len", 1024))),
        max_num_batched_tokens=int(ek.get("max_num_batched_tokens", VLLM_MAX_NUM_BATCHED_TOKENS)),
        max_num_seqs=int(ek.get("max_num_seqs", VLLM_MAX_NUM_SEQS)),
        rollouts_per_runner=-(-rollouts // runners) if rollouts else 0,
    )
    extras = {"chunk_size": mc.get("logprob_chunk_size"), "engine_kwargs": ek,
              "learner_on_gpu": float(getattr(config, "num_gpus_per_learner", 0) or 0) > 0}
    return layout, engine, extras


def plan(config: Any) -> MemoryPlan:
    """The memory plan of a GRPOConfig (or SPEAR/SPADER config): its model (``model_config_for``),
    ``learners()``, ``env_runners()`` and ``training(micro_batch_token_budget)``."""
    mc = dict(config.model_config or {})
    cfg_json, name, source = model_config_for(str(mc.get("model_path", "")))
    shape = ModelShape.from_config(cfg_json, name)
    layout, engine, extras = _layouts_of(config)
    gpu = getattr(config, "gpu_memory_gb", None)
    eng_gpu = getattr(config, "engine_gpu_memory_gb", None)
    out = plan_memory(shape, layout, micro_batch_token_budget=int(config.micro_batch_token_budget),
                      max_model_len=int(config.max_model_len), gpu_memory_gb=gpu, engine=engine,
                      engine_gpu_memory_gb=eng_gpu, chunk_size=extras["chunk_size"], model_source=source,
                      learner_on_gpu=extras["learner_on_gpu"])
    if engine.engine == "vllm" and engine.gpus_per_runner and engine.tensor_parallel > engine.gpus_per_runner:
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

