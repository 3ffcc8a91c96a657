"""Colocated GPUs (``.resources(colocate=True)``): one learner rank and one engine on each GPU
(:class:`ColocatedPlan`, :func:`plan_colocated`; what to change when it does not fit: ``fixes.py``).

The two residents take turns (pipelines/colocation.py), so the GPU must hold each phase of
an iteration, with G = ``gpu_memory_gb``:

    sampling   learner resident + allowance + engine awake          <= G
    training   learner peak (its plan's total) + engine asleep       <= G
    sync       learner resident + allowance + engine weights + bucket <= G

* learner resident: what stays on the GPU between updates: parameters, gradients (RLlib frees
  them at the start of the next update, not after the step), AdamW state, DDP buckets and the
  reference model (:attr:`LearnerPlan.persistent`); the activations' blocks are returned to the
  driver before the engine wakes (``torch.cuda.empty_cache``); the allowance is the planner's
  ``OVERHEAD_GIB`` (the learner's CUDA context, NCCL workspaces, fragmentation);
* engine awake: vLLM claims ``gpu_memory_utilization`` x G (weights, profile reserve, KV cache);
  the HF engine its weights (its KV cache grows with the batch and is not planned);
* engine asleep: at both sleep levels the weights and the KV cache leave the GPU; what remains is
  the engine's CUDA context, CUDA graphs and non-torch allocations (``VLLM_ASLEEP_GIB``, an
  estimate: unverified on a GPU here; ``HF_ASLEEP_GIB`` for the HF engine's CUDA context);
* bucket: the weight sync's device buffers, ``SYNC_DEVICE_BUCKETS`` x ``weight_sync_bucket_mb``: the
  gathered bucket being sent, the next one (the object store's sender looks one ahead) and its packed
  copy (``weight_streaming/staging.py`` packs a bucket on the device before its one host copy).

Host memory: sleep level 1 backs each engine's weights up to pinned CPU memory (weights bytes per
GPU, ``GPUS_PER_NODE`` GPUs per node); level 2 keeps no copy (the sync rewrites the weights).
"""
from __future__ import annotations

from dataclasses import dataclass

from .engine import EnginePlan
from .layouts import GIB, GPUS_PER_NODE, OVERHEAD_GIB, _gib
from .layouts import gib_text as _g
from .learner import LearnerPlan

__all__ = ["ColocatedPlan", "plan_colocated", "VLLM_ASLEEP_GIB", "HF_ASLEEP_GIB", "SYNC_DEVICE_BUCKETS"]

#: GPU memory a sleeping vLLM engine keeps (CUDA context, CUDA graphs, non-torch allocations); an
#: estimate, unverified on a GPU here.
VLLM_ASLEEP_GIB = 1.0
#: GPU memory a sleeping HF engine keeps (its process's CUDA context).
HF_ASLEEP_GIB = 0.5


@dataclass
class ColocatedPlan:
    """One GPU shared by a learner rank and an engine (see the module doc)."""

    learner: LearnerPlan
    engine: EnginePlan
    gpu_gib: float | None
    sleep_level: int = 1
    bucket_bytes: int = 0
    ranks_per_node: int = 1  # colocated pairs per node (level 1's pinned weight copies)

    @property
    def vllm(self) -> bool:
        return self.engine.layout.engine == "vllm"

    @property
    def asleep(self) -> int:
        """What the sleeping engine keeps on the GPU."""
        return int((VLLM_ASLEEP_GIB if self.vllm else HF_ASLEEP_GIB) * GIB)

    @property
    def engine_awake(self) -> int | None:
        """vLLM: gpu_memory_utilization x G (None without G); HF: its weights."""
        if not self.vllm:
            return self.engine.weights
        if self.gpu_gib is None:
            return None
        return int(self.engine.layout.gpu_memory_utilization * self.gpu_gib * GIB)

    @property
    def learner_resident(self) -> int:
        """The learner's state between updates, plus its allowance."""
        return self.learner.persistent + self.learner.overhead

    @property
    def training(self) -> int:
        return self.learner.total + self.asleep

    @property
    def sampling(self) -> int | None:
        awake = self.engine_awake
        return None if awake is None else self.learner_resident + awake

    @property
    def sync(self) -> int:
        return self.learner_resident + self.engine.weights + self.bucket_bytes

    @property
    def peak(self) -> int | None:
        s = self.sampling
        return None if s is None else max(self.training, s, self.sync)

    def _fits(self, b: int | None) -> bool | None:
        if self.gpu_gib is None or b is None:
            return None
        return _gib(b) <= self.gpu_gib

    @property
    def training_fits(self) -> bool | None:
        return self._fits(self.training)

    @property
    def sampling_fits(self) -> bool | None:
        return self._fits(max(self.sampling, self.sync) if self.sampling is not None else None)

    @property
    def host_bytes_per_node(self) -> int:
        """Pinned host memory of the engines' weight copies (sleep level 1) on one node."""
        return self.engine.weights * self.ranks_per_node if (self.vllm and self.sleep_level == 1) else 0

    def host_fits(self, host_gib: float | None, learner_host_bytes: int = 0) -> bool | None:
        if host_gib is None or not self.host_bytes_per_node:
            return None
        return _gib(self.host_bytes_per_node + learner_host_bytes) <= host_gib

    @property
    def fits(self) -> bool | None:
        verdicts = [v for v in (self.training_fits, self.sampling_fits) if v is not None]
        return None if not verdicts else all(verdicts)

    def lines(self) -> list[str]:
        """The section of ``rllib-spear plan``."""
        lvl = {1: "level 1: weights to pinned CPU memory, KV cache dropped",
               2: "level 2: weights and KV cache dropped, the sync rewrites the weights"}[self.sleep_level]
        out = [f"colocated GPU (colocate=True: one learner rank + one {self.engine.layout.engine} engine per GPU; "
               f"engine sleep {lvl}), GiB:"]
        awake = self.engine_awake
        what = (f"gpu_memory_utilization {self.engine.layout.gpu_memory_utilization:g} x GPU" if self.vllm
                else "weights; the HF KV cache grows with the batch (not planned)")
        rows = [("learner resident", self.learner_resident, "parameters + gradients + AdamW + reference + allowance"),
                ("engine awake", awake, what),
                ("engine asleep", self.asleep, "CUDA context / graphs left by sleep (estimate)"),
                ("sampling phase", self.sampling, "learner resident + engine awake"),
                ("training phase", self.training, "learner peak + engine asleep"),
                ("weight-sync phase", self.sync, "learner resident + engine weights + bucket")]
        for name, b, why in rows:
            out.append(f"  {name:<27}{_g(b) if b is not None else '-':>8}  {why}")
        if self.host_bytes_per_node:
            out.append(f"  {'host (pinned, per node)':<27}{_g(self.host_bytes_per_node):>8}  "
                       f"engine weight copies of sleep level 1 x {self.ranks_per_node} GPUs")
        return out


#: Buckets of the weight sync alive on the learner's device at once (module docstring, "bucket").
SYNC_DEVICE_BUCKETS = 3


def plan_colocated(learner: LearnerPlan, engine: EnginePlan, gpu_gib: float | None, *, sleep_level: int = 1,
                   bucket_bytes: int = 0, ranks_per_node: int | None = None) -> ColocatedPlan:
    """The colocated plan of a learner plan and an engine plan on one ``gpu_gib`` GPU."""
    if ranks_per_node is None:
        ranks_per_node = min(learner.layout.ranks, GPUS_PER_NODE)
    return ColocatedPlan(learner, engine, gpu_gib, int(sleep_level), int(bucket_bytes), int(ranks_per_node))
