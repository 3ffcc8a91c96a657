"""Colocated GPUs (``.resources(colocate=True)``): one learner rank and one engine on each GPU
(:class:`ColocatedPlan`, :func:`plan_colocated`, :func:`colocated_problems`).

The two residents take turns (algorithms/grpo/colocation.py), so the GPU must hold each phase of
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
* bucket: the weight sync's staging buffer, ``weight_sync_bucket_mb``.

Host memory: sleep level 1 backs each engine's weights up to pinned CPU memory (weights bytes per
GPU, ``GPUS_PER_NODE`` GPUs per node); level 2 keeps no copy (the sync rewrites the weights).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .engine import EnginePlan, plan_engine
from .layouts import GIB, GPUS_PER_NODE, OVERHEAD_GIB, _gib
from .learner import LearnerPlan, plan_learner

if TYPE_CHECKING:  # pragma: no cover
    from ..planner import MemoryPlan

__all__ = ["ColocatedPlan", "plan_colocated", "colocated_problems", "VLLM_ASLEEP_GIB", "HF_ASLEEP_GIB"]

#: GPU memory a sleeping vLLM engine keeps (CUDA context, CUDA graphs, non-torch allocations); an
#: estimate, unverified on a GPU here.
VLLM_ASLEEP_GIB = 1.0
#: GPU memory a sleeping HF engine keeps (its process's CUDA context).
HF_ASLEEP_GIB = 0.5


def _g(b: float) -> str:
    return f"{b / GIB:.2f}"


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


def plan_colocated(learner: LearnerPlan, engine: EnginePlan, gpu_gib: float | None, *, sleep_level: int = 1,
                   bucket_bytes: int = 0, ranks_per_node: int | None = None) -> ColocatedPlan:
    """The colocated plan of a learner plan and an engine plan on one ``gpu_gib`` GPU."""
    if ranks_per_node is None:
        ranks_per_node = min(learner.layout.ranks, GPUS_PER_NODE)
    return ColocatedPlan(learner, engine, gpu_gib, int(sleep_level), int(bucket_bytes), int(ranks_per_node))


# ---------------------------------------------------------------------- fixes
def _set(section: str, kw: dict) -> str:
    """A fix as the builder call and the ``--set`` flags (planner_report's form)."""
    from ..planner_report import _call

    return _call(section, kw)


def _engine_util(u: float) -> str:
    from ..planner_report import set_form

    return (f'engine_kwargs "gpu_memory_utilization": {u:g} '
            f"({set_form('env_runners', {'engine_kwargs': {'gpu_memory_utilization': u}})})")


def _replan(p: "MemoryPlan", c: ColocatedPlan, **layout_kw) -> ColocatedPlan:
    lay = c.learner.layout.replace(**layout_kw)
    lp = plan_learner(p.shape, lay, micro_batch_token_budget=c.learner.micro_batch_token_budget,
                      max_model_len=p.max_model_len, chunk_size=p.chunk_size)
    return dataclasses.replace(c, learner=lp)


def _with_util(p: "MemoryPlan", c: ColocatedPlan, u: float) -> ColocatedPlan:
    eng = plan_engine(p.shape, c.engine.layout.replace(gpu_memory_utilization=u), c.gpu_gib)
    return dataclasses.replace(c, engine=eng)


def _utilizations(c: ColocatedPlan) -> list[float]:
    """Candidate gpu_memory_utilization values (0.05 steps) between 0.05 and 0.95."""
    return [round(0.05 * i, 2) for i in range(1, 20)]


def colocated_problems(p: "MemoryPlan") -> list[str]:
    """What does not fit on a colocated GPU and the single changes that would (naming the knobs:
    gpu_memory_utilization, micro_batch_token_budget and the learners() layout, sleep level)."""
    from ..planner_report import learner_fixes

    c = p.colocated
    assert c is not None
    g = c.gpu_gib
    out = []
    if g is None:
        return out
    u = c.engine.layout.gpu_memory_utilization
    if c.vllm and c.engine.fits is False:
        fixes = [_engine_util(v) + f": {cc.engine.kv_tokens:,} KV tokens, sampling phase {_g(cc.sampling)} GiB"
                 for v in _utilizations(c) if v > u
                 for cc in [_with_util(p, c, v)] if cc.engine.fits and cc.sampling_fits][:1]
        msg = (f"colocated engine: gpu_memory_utilization={u:g} x {g:g} GiB holds weights {_g(c.engine.weights)} + "
               f"reserve {_g(c.engine.reserve)} GiB, leaving its KV cache {c.engine.kv_tokens:,} tokens, fewer than "
               f"one max_model_len={c.engine.layout.max_model_len} sequence.")
        out.append(msg + (" Changes that fit:\n  - " + "\n  - ".join(fixes) if fixes else
                          " No gpu_memory_utilization leaves room for the learner beside it: lower max_model_len, "
                          "or set colocate=False (learners and engines on their own GPUs)"))
    if c.training_fits is False:
        left = g - _gib(c.asleep)
        shadow = dataclasses.replace(p, gpu_memory_gb=left, colocated=None)
        out.append(f"colocated training phase: the sleeping engine keeps {_g(c.asleep)} GiB of the {g:g} GiB GPU, "
                   f"leaving {left:.2f} GiB to the learner (with colocate=True, num_env_runners follows "
                   f"num_learners): " + learner_fixes(shadow))
    if c.sampling_fits is False:
        msg = (f"colocated sampling phase: the learner keeps {_g(c.learner_resident)} GiB on the GPU between "
               f"updates (parameters {_g(c.learner.params)}, gradients {_g(c.learner.grads + c.learner.buckets)}, "
               f"AdamW {_g(c.learner.optim)}, reference {_g(c.learner.reference)}, allowance {OVERHEAD_GIB:g}) "
               f"while the awake engine claims {_g(c.engine_awake)} GiB"
               + (f" (gpu_memory_utilization={u:g})" if c.vllm else "")
               + f": {_g(max(c.sampling, c.sync))} GiB, more than gpu_memory_gb={g:g}.")
        fixes = []
        if c.vllm:
            for v in sorted(_utilizations(c), reverse=True):
                if v >= u:
                    continue
                cc = _with_util(p, c, v)
                if cc.sampling_fits and cc.engine.fits:
                    fixes.append(_engine_util(v) + f": sampling phase {_g(cc.sampling)} GiB, "
                                 f"{cc.engine.kv_tokens:,} KV tokens = {cc.engine.sequences} sequences")
                    break
        lay = c.learner.layout
        if lay.num_learners >= 1 and not lay.cpu_offload:
            cc = _replan(p, c, sharding="fsdp", cpu_offload=True)
            if cc.fits:
                kw = {"sharding": "fsdp", "cpu_offload": True} if not lay.fsdp else {"cpu_offload": True}
                fixes.append(_set("learners", kw) + f": learner resident {_g(cc.learner_resident)} GiB "
                             f"(its state in CPU memory)")
        for n in (2, 4, 8, 16, 32, 64, 128):
            if n <= lay.ranks:
                continue
            cc = _replan(p, c, sharding="fsdp", num_learners=n)
            if cc.fits:
                fixes.append(_set("learners", {"num_learners": n, "sharding": "fsdp"})
                             + f" with .env_runners(num_env_runners={n}): learner resident "
                             f"{_g(cc.learner_resident)} GiB per GPU")
                break
        out.append(msg + (" Changes that fit:\n  - " + "\n  - ".join(fixes) if fixes
                          else " No single change fits; or set colocate=False"))
    return out


def colocated_host_problem(p: "MemoryPlan") -> str | None:
    """The pinned host memory of sleep level 1 (plus ``cpu_offload``'s) against ``host_memory_gb``."""
    c = p.colocated
    if c is None or c.host_fits(p.host_memory_gb, p.learner.cpu_ram_per_node) is not False:
        return None
    return (f"colocated engines at sleep level 1 pin {_g(c.host_bytes_per_node)} GiB of host memory per node "
            f"(their weights, {c.ranks_per_node} GPUs) beside the learners' {_g(p.learner.cpu_ram_per_node)} GiB, "
            f"more than host_memory_gb={p.host_memory_gb:g}. Change that fits:\n  - "
            + _set("resources", {"colocate_sleep_level": 2}) + ": the weights are dropped while the learners "
            "train and the weight sync writes them back (no host copy)")
