"""The whole memory plan of one config (:class:`MemoryPlan`, :func:`plan_memory`): the chosen
learner layout and its alternatives, the engine, and the colocated GPU; docs/memory_planner.md
derives every term and compares them with measurements (benchmarks/planner_accuracy.py).

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
node, pinned; ``rllib-spear plan --host-memory-gb`` checks it against a node's RAM). CPU learners
(``num_gpus_per_learner=0``) hold all of the above in RAM: the per-rank peak times the learner
ranks, all on one machine (a local cluster), checked against ``host_memory_gb``; ``validate()``
warns when this machine's available RAM cannot hold it (``check_cpu_learner_memory``). Per engine GPU (vLLM): weights P * b / tp; KV cache = gpu_memory_utilization * G - weights -
the profile-run reserve, at 2 * layers * kv_heads/tp * head_dim * b bytes per token.

Colocated GPUs (``.resources(colocate=True)``: a learner rank and an engine per GPU, the engine
asleep while the learner trains): ``planning.colocate`` checks each phase of an iteration
(sampling, training, weight sync) against the one GPU, and the host copies of sleep level 1.
Pure Python.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..models.shapes import ModelShape
from .colocate import ColocatedPlan
from .engine import EnginePlan, plan_engine
from .layouts import EngineLayout, LearnerLayout
from .learner import LearnerPlan, alternative_layouts, plan_learner

__all__ = ["MemoryPlan", "plan_memory", "available_host_memory_gb"]


def available_host_memory_gb(meminfo: str = "/proc/meminfo") -> float | None:
    """This machine's available RAM in GiB (``MemAvailable`` of ``meminfo``: free plus reclaimable
    cache), its physical RAM where that line is missing, None where neither can be read."""
    try:
        with open(meminfo, encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 / 2**30
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


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
    def learner_host_bytes(self) -> int:
        """CPU learners: the RAM their ranks need on one machine (the per-rank peak, state and
        activations, times the ranks); 0 for GPU learners (their host share is ``cpu_offload``'s)."""
        return 0 if self.learner_on_gpu else self.learner.total * self.learner.layout.ranks

    @property
    def host_fits(self) -> bool | None:
        """Whether a learner node's host memory holds the learners' part: CPU learners' whole
        peak, or for GPU learners the pinned RAM of ``cpu_offload`` (None when no host memory
        is declared, or nothing of GPU learners lives in host RAM)."""
        if not self.learner_on_gpu:
            return None if self.host_memory_gb is None else self.learner_host_bytes / 2**30 <= self.host_memory_gb
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
