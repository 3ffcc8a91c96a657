"""Planner constants, dtype sizes and the layouts the planner reads from a config: how the policy
lies on the learners (:class:`LearnerLayout`) and on the rollout engines (:class:`EngineLayout`)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

GIB = 2**30
#: Fixed allowance per GPU: CUDA context (~0.5-1 GiB), NCCL and cuBLAS workspaces (~1 GiB) and
#: caching-allocator fragmentation (~1.5 GiB); added to every learner total.
OVERHEAD_GIB = 3.0
#: Learner ranks per node, for the CPU RAM of ``cpu_offload``.
GPUS_PER_NODE = 8
#: vLLM defaults assumed when engine_kwargs does not set them.
VLLM_GPU_MEMORY_UTILIZATION = 0.9
#: ``gpu_memory_utilization`` of a colocated vLLM engine when ``engine_kwargs`` sets none
#: (``.resources(colocate=True)``): vLLM's own 0.9 would leave the learner beside it almost
#: nothing (verl's rollout default is 0.5 too). env_runners/placement.py passes it to the engine.
COLOCATED_GPU_MEMORY_UTILIZATION = 0.5
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


def gib_text(b: float) -> str:
    """Bytes as GiB with two decimals, as the report and the fixes print them."""
    return f"{b / GIB:.2f}"


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
    packed: bool = False  # packed_microbatches: a micro-batch's real tokens in one row
    attention: str | None = None  # model_config["attn_implementation"] (None: transformers' sdpa)

    @property
    def dense_packed_mask(self) -> bool:
        """A packed row's block-diagonal mask is a dense N x N one (sdpa, eager), which SDPA turns
        into an N x N float bias per layer; flex_attention's block mask and sdpa_varlen (no mask)
        skip that."""
        return self.packed and self.attention in (None, "sdpa", "eager")

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
        if self.packed:
            parts.append("packed")
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
