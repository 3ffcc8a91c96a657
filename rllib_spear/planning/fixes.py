"""What to change when a memory plan does not fit: one message per part (:func:`plan_problems`),
each naming the single changes that would fit, as the builder call and the ``rllib-spear``
``--set`` flags (:func:`set_form`): the learner's layout, token budget or LoRA
(:func:`learner_fixes`), the engine's tensor parallelism, memory share or sequence length
(:func:`engine_fixes`), the learner node's pinned host memory (:func:`host_fixes`), and the
phases of a colocated GPU (:func:`colocated_problems`, :func:`colocated_host_problem`). Each fix
is planned again before it is named. Pure Python."""
from __future__ import annotations

import dataclasses
import json
from typing import Callable

from .colocate import ColocatedPlan
from .engine import plan_engine
from .layouts import GIB, GPUS_PER_NODE, OVERHEAD_GIB, LearnerLayout, _gib
from .layouts import gib_text as _g
from .learner import LearnerPlan, plan_learner
from .memory_plan import MemoryPlan

__all__ = ["plan_problems", "learner_fixes", "engine_fixes", "host_fixes", "colocated_problems",
           "colocated_host_problem", "set_form"]


def plan_problems(p: MemoryPlan) -> list[str]:
    """One message per part of ``p`` that does not fit, naming what to change (``check_fits``'s
    error, the report's verdict)."""
    out = []
    if p.colocated is not None:  # its phases replace the learner's and the engine's own checks
        out += colocated_problems(p)
        if p.host_fits is False:
            out.append(host_fixes(p))
        host = colocated_host_problem(p)
        return out + ([host] if host else [])
    if p.learner_fits is False:
        out.append(learner_fixes(p))
    if p.host_fits is False:
        out.append(host_fixes(p))
    if p.engine is not None and p.engine.fits is False:
        out.append(engine_fixes(p))
    return out


# ---------------------------------------------------------------------- learner, engine, host
def _set_value(v: object) -> str:
    """A value as a ``--set`` writes it (YAML: true / false, JSON for a mapping, quoted for the shell)."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, dict):
        return "'" + json.dumps(v) + "'"
    return str(v)


def set_form(section: str, kw: dict) -> str:
    """The ``rllib-spear`` flags of a builder call: ``--set learners.sharding=fsdp ...`` (a
    nested mapping becomes one flag per leaf: ``engine_kwargs.tensor_parallel_size=4``)."""
    flags = []
    for k, v in kw.items():
        if isinstance(v, dict) and k in _NESTED_SET:
            flags += [f"--set {section}.{k}.{kk}={_set_value(vv)}" for kk, vv in v.items()]
        else:
            flags.append(f"--set {section}.{k}={_set_value(v)}")
    return " ".join(flags)


#: Builder kwargs whose mappings a fix changes one key of (the rest of the mapping stays).
_NESTED_SET = ("engine_kwargs", "model_config")


def _call(section: str, kw: dict) -> str:
    """A fix in both forms: the Python builder call and the ``rllib-spear`` flags."""
    args = ", ".join(f"{k}={v!r}".replace("'", '"') for k, v in kw.items())
    return f".{section}({args}) ({set_form(section, kw)})"


def _learners_call(kw: dict) -> str:
    return _call("learners", kw)


def learner_fixes(p: MemoryPlan) -> str:
    """The learner part of validate()'s message: what the config needs and the single changes
    (``.learners(...)`` kwargs, ``micro_batch_token_budget``, LoRA) that would fit, with what each
    needs per GPU."""
    lp, g = p.learner, p.gpu_memory_gb
    lay = lp.layout
    budget = lp.micro_batch_token_budget

    def run(layout: LearnerLayout, b: int = budget) -> LearnerPlan:
        return plan_learner(p.shape, layout, micro_batch_token_budget=b, max_model_len=p.max_model_len,
                            chunk_size=p.chunk_size)

    cands: list[tuple[str, Callable[[], LearnerPlan]]] = []
    ac = lay.activation_checkpointing
    if not lay.fsdp and lay.ranks > 1:
        cands.append((_learners_call({"sharding": "fsdp"}), lambda: run(lay.replace(sharding="fsdp"))))
    if not ac:
        cands.append((_learners_call({"activation_checkpointing": True}),
                      lambda: run(lay.replace(activation_checkpointing=True))))
        if not lay.fsdp and lay.ranks > 1:
            cands.append((_learners_call({"sharding": "fsdp", "activation_checkpointing": True}),
                          lambda: run(lay.replace(sharding="fsdp", activation_checkpointing=True))))
    found = False
    for want_ac in ([ac] if ac else [False, True]):  # the fewest learners that fit, without AC first
        for n in (2, 4, 8, 16, 32, 64, 128):
            if found or n <= lay.ranks:
                continue
            cand = lay.replace(sharding="fsdp", num_learners=n, activation_checkpointing=want_ac)
            if run(cand).fits(g):
                kw = {"num_learners": n, "sharding": "fsdp"}
                if want_ac and not ac:
                    kw["activation_checkpointing"] = True
                cands.append((_learners_call(kw), lambda c=cand: run(c)))
                found = True
    if lay.num_learners >= 1:  # FSDP runs on remote learner ranks (one is enough to offload)
        for want_ac in ([ac] if ac else [False, True]):  # the first that fits (else the last tried)
            cand = lay.replace(sharding="fsdp", cpu_offload=True, activation_checkpointing=want_ac)
            kw = {"sharding": "fsdp", "cpu_offload": True} if not lay.fsdp else {"cpu_offload": True}
            if want_ac and not ac:
                kw["activation_checkpointing"] = True
            if run(cand).fits(g) or want_ac:
                cands.append((_learners_call(kw), lambda c=cand: run(c)))
                break
    b = budget // 2
    while b >= 256:
        if run(lay, b).fits(g):
            cands.append((_call("training", {"micro_batch_token_budget": b}), lambda b=b: run(lay, b)))
            break
        b //= 2
    if not lay.lora:
        lora = {"r": 64, "target_modules": "all-linear"}
        cands.append(('.rl_module(model_config={..., "lora": {"r": 64, "target_modules": "all-linear"}}) ('
                      + set_form("rl_module", {"model_config": {"lora": lora}}) + ")",
                      lambda: run(lay.replace(lora=lora))))
    fitting, closest = [], None
    for text, f in cands:
        c = f()
        extra = f" + {_g(c.cpu_ram_per_node)} GiB CPU RAM per node" if c.cpu_ram_per_node else ""
        item = f"{text}: {_g(c.total)} GiB per learner GPU{extra}"
        if c.fits(g):
            fitting.append(item)
        elif closest is None or c.total < closest[0]:
            closest = (c.total, item)
    a = lp.activations
    msg = (f"the learner needs {_g(lp.total)} GiB per GPU ({lay.label()}: parameters {_g(lp.params)}, gradients "
           f"{_g(lp.grads + lp.buckets)}, AdamW {_g(lp.optim)}, gathered/autocast {_g(lp.gathered + lp.autocast_copy)}, "
           f"activations {_g(a.total)} for {a.rows} x {a.row_len} tokens, reference {_g(lp.reference)}, "
           f"allowance {OVERHEAD_GIB:g}), more than gpu_memory_gb={g:g}.")
    if fitting:
        return msg + " Changes that fit:\n  - " + "\n  - ".join(fitting)
    return msg + " No single change fits; the closest: " + (closest[1] if closest else "none")


def engine_fixes(p: MemoryPlan) -> str:
    """The engine part of validate()'s message: tensor parallelism, gpu_memory_utilization,
    max_model_len."""
    e = p.engine
    assert e is not None
    lay = e.layout
    if lay.engine != "vllm":
        return (f"the {lay.engine} engine's weights ({_g(e.weights)} GiB + {OVERHEAD_GIB:g} GiB allowance) exceed "
                f"engine_gpu_memory_gb={e.gpu_gib:g}: use engine='vllm' with engine_kwargs tensor_parallel_size "
                f"(--set env_runners.engine=vllm --set env_runners.engine_kwargs.tensor_parallel_size=N)")
    msg = (f"the engine GPU holds weights {_g(e.weights)} GiB + reserve {_g(e.reserve)} GiB, leaving "
           f"{_g(max(0, e.kv_bytes))} GiB of gpu_memory_utilization={lay.gpu_memory_utilization:g} x {e.gpu_gib:g} GiB "
           f"for the KV cache: {e.kv_tokens:,} tokens, fewer than one max_model_len={lay.max_model_len} sequence.")
    fixes = []
    for tp in (2, 4, 8):
        if tp > lay.tensor_parallel:
            c = plan_engine(p.shape, lay.replace(tensor_parallel=tp, gpus_per_runner=tp), e.gpu_gib)
            if c.fits:
                flags = set_form("env_runners", {"num_gpus_per_env_runner": tp,
                                                 "engine_kwargs": {"tensor_parallel_size": tp}})
                call = f'.env_runners(num_gpus_per_env_runner={tp}, engine_kwargs={{..., "tensor_parallel_size": {tp}}})'
                fixes.append(f"{call} ({flags}): {c.kv_tokens:,} KV tokens = {c.sequences} sequences")
                break
    for u in (0.9, 0.95):
        if u > lay.gpu_memory_utilization:
            c = plan_engine(p.shape, lay.replace(gpu_memory_utilization=u), e.gpu_gib)
            if c.fits:
                flags = set_form("env_runners", {"engine_kwargs": {"gpu_memory_utilization": u}})
                fixes.append(f'engine_kwargs "gpu_memory_utilization": {u} ({flags}): {c.kv_tokens:,} KV tokens = '
                             f"{c.sequences} sequences")
                break
    if e.kv_tokens and e.kv_tokens >= 1024:
        longest = e.kv_tokens // 256 * 256
        fixes.append(_call("env_runners", {"max_model_len": longest}) + " (the most the KV cache holds)")
    return msg + (" Changes that fit:\n  - " + "\n  - ".join(fixes) if fixes else " No single change fits.")


def cpu_learner_host_fixes(p: MemoryPlan) -> str:
    """The host part of the verdict for CPU learners: their peak exceeds ``host_memory_gb``; the
    largest ``micro_batch_token_budget`` (halving) and activation checkpointing, each with its need."""
    lp, h = p.learner, p.host_memory_gb
    lay, budget = lp.layout, lp.micro_batch_token_budget

    def need(layout: LearnerLayout, b: int = budget) -> float:
        return plan_learner(p.shape, layout, micro_batch_token_budget=b, max_model_len=p.max_model_len,
                            chunk_size=p.chunk_size).total * layout.ranks / GIB

    msg = (f"the CPU learners need about {_g(p.learner_host_bytes)} GiB of RAM ({lay.ranks} x {_g(lp.total)} GiB: "
           f"float32 weights, gradients, AdamW state and the activations of micro-batches of {budget} tokens), "
           f"more than the {h:g} GiB of host memory; the process may be killed for memory.")
    fixes = []
    b = budget // 2
    while b >= 128:
        if need(lay, b) <= h:
            fixes.append(f"{_call('training', {'micro_batch_token_budget': b})}: {need(lay, b):.1f} GiB")
            break
        b //= 2
    if not lay.activation_checkpointing:
        ac = lay.replace(activation_checkpointing=True)
        fixes.append(f"{_learners_call({'activation_checkpointing': True})}: {need(ac):.1f} GiB "
                     "(recomputes each block in the backward)")
    return msg + " Changes:\n  - " + "\n  - ".join(fixes or ["a smaller model, or a machine with more RAM"])


def host_fixes(p: MemoryPlan) -> str:
    """The host part of the verdict: the pinned ``cpu_offload`` state of a learner node exceeds
    ``host_memory_gb``; more learners (FSDP shards the state over every rank, 8 per node), or no
    offload with the fewest learner GPUs that hold the state. CPU learners: ``cpu_learner_host_fixes``."""
    if not p.learner_on_gpu:
        return cpu_learner_host_fixes(p)
    lp, h, g = p.learner, p.host_memory_gb, p.gpu_memory_gb
    lay = lp.layout

    def run(layout: LearnerLayout) -> LearnerPlan:
        return plan_learner(p.shape, layout, micro_batch_token_budget=lp.micro_batch_token_budget,
                            max_model_len=p.max_model_len, chunk_size=p.chunk_size)

    msg = (f"the learner node needs {_g(lp.cpu_ram_per_node)} GiB of pinned host memory for cpu_offload "
           f"({_g(lp.cpu_ram_per_rank)} GiB per rank x {min(lay.ranks, GPUS_PER_NODE)} ranks: float32 shards, "
           f"gradients and AdamW state), more than host_memory_gb={h:g} (--host-memory-gb).")
    fixes = []
    for n in (16, 32, 64, 128):
        c = run(lay.replace(num_learners=n))
        if n > lay.ranks and c.host_fits(h):
            fixes.append(f"{_learners_call({'num_learners': n})}: {_g(c.cpu_ram_per_node)} GiB per node "
                         f"over {-(-n // GPUS_PER_NODE)} nodes")
            break
    for n in (8, 16, 32, 64, 128):
        c = run(lay.replace(num_learners=n, cpu_offload=False))
        if n >= lay.ranks and g is not None and c.fits(g):
            fixes.append(f"{_learners_call({'num_learners': n, 'cpu_offload': False})}: "
                         f"{_g(c.total)} GiB per learner GPU, nothing pinned")
            break
    fixes.append("--host-memory-gb <RAM of your learner node in GiB> when it has more")
    return msg + " Changes that fit:\n  - " + "\n  - ".join(fixes)


# ---------------------------------------------------------------------- colocated GPUs
def _engine_util(u: float) -> str:
    return (f'engine_kwargs "gpu_memory_utilization": {u:g} '
            f"({set_form('env_runners', {'engine_kwargs': {'gpu_memory_utilization': u}})})")


def _replan(p: MemoryPlan, c: ColocatedPlan, **layout_kw) -> ColocatedPlan:
    lay = c.learner.layout.replace(**layout_kw)
    lp = plan_learner(p.shape, lay, micro_batch_token_budget=c.learner.micro_batch_token_budget,
                      max_model_len=p.max_model_len, chunk_size=p.chunk_size)
    return dataclasses.replace(c, learner=lp)


def _with_util(p: MemoryPlan, c: ColocatedPlan, u: float) -> ColocatedPlan:
    eng = plan_engine(p.shape, c.engine.layout.replace(gpu_memory_utilization=u), c.gpu_gib)
    return dataclasses.replace(c, engine=eng)


def _utilizations(c: ColocatedPlan) -> list[float]:
    """Candidate gpu_memory_utilization values (0.05 steps) between 0.05 and 0.95."""
    return [round(0.05 * i, 2) for i in range(1, 20)]


def colocated_problems(p: MemoryPlan) -> list[str]:
    """What does not fit on a colocated GPU and the single changes that would (naming the knobs:
    gpu_memory_utilization, micro_batch_token_budget and the learners() layout, sleep level)."""
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
                fixes.append(_call("learners", kw) + f": learner resident {_g(cc.learner_resident)} GiB "
                             f"(its state in CPU memory)")
        for n in (2, 4, 8, 16, 32, 64, 128):
            if n <= lay.ranks:
                continue
            cc = _replan(p, c, sharding="fsdp", num_learners=n)
            if cc.fits:
                fixes.append(_call("learners", {"num_learners": n, "sharding": "fsdp"})
                             + f" with .env_runners(num_env_runners={n}): learner resident "
                             f"{_g(cc.learner_resident)} GiB per GPU")
                break
        out.append(msg + (" Changes that fit:\n  - " + "\n  - ".join(fixes) if fixes
                          else " No single change fits; or set colocate=False"))
    return out


def colocated_host_problem(p: MemoryPlan) -> str | None:
    """The pinned host memory of sleep level 1 (plus ``cpu_offload``'s) against ``host_memory_gb``."""
    c = p.colocated
    if c is None or c.host_fits(p.host_memory_gb, p.learner.cpu_ram_per_node) is not False:
        return None
    return (f"colocated engines at sleep level 1 pin {_g(c.host_bytes_per_node)} GiB of host memory per node "
            f"(their weights, {c.ranks_per_node} GPUs) beside the learners' {_g(p.learner.cpu_ram_per_node)} GiB, "
            f"more than host_memory_gb={p.host_memory_gb:g}. Change that fits:\n  - "
            + _call("resources", {"colocate_sleep_level": 2}) + ": the weights are dropped while the learners "
            "train and the weight sync writes them back (no host copy)")
