"""Rollout engine (vLLM) memory per GPU: weights, the profile-run reserve and the KV cache left
(:class:`EnginePlan`, :func:`plan_engine`)."""
from __future__ import annotations

from dataclasses import dataclass

from ..models.shapes import ModelShape
from .layouts import (
    GIB,
    OVERHEAD_GIB,
    VLLM_FIXED_RESERVE_GIB,
    EngineLayout,
    _gib,
    dtype_bytes,
)

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
