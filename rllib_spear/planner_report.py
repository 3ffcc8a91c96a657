"""Text of a memory plan (``rllib-spear plan``) and the fixes ``validate()`` names when a config
does not fit (``rllib_spear.planner``). Pure Python."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Callable

from .planner import GIB, GPUS_PER_NODE, OVERHEAD_GIB, EnginePlan, LearnerLayout, LearnerPlan, plan_engine, plan_learner

if TYPE_CHECKING:
    from .planner import MemoryPlan

__all__ = ["format_plan", "learner_fixes", "engine_fixes", "host_fixes", "set_form"]


def _g(b: float) -> str:
    return f"{b / GIB:.2f}"


def _verdict(ok: bool | None) -> str:
    return {True: "fits", False: "DOES NOT FIT", None: "-"}[ok]


def _layout_words(lay: LearnerLayout) -> str:
    mp = {None: f"no mixed precision (compute in {lay.weight_dtype})",
          "bf16": "mixed_precision bf16 (float32 master weights, gradients and AdamW state; bf16 compute)"
          }.get(lay.mixed_precision, str(lay.mixed_precision))
    if lay.mixed_precision is None and lay.weight_dtype not in ("float32", "fp32", "float"):
        mp = f"{lay.weight_dtype} weights, gradients and AdamW state (no float32 master copy)"
    tune = (f"LoRA r={lay.lora.get('r', 8)} on {lay.lora.get('target_modules', '[q_proj, v_proj]')}"
            if lay.lora else "full fine-tune")
    return (f"{lay.ranks} learner(s), sharding {lay.sharding}{' + cpu_offload' if lay.cpu_offload else ''}, "
            f"{mp}, activation checkpointing {'on' if lay.activation_checkpointing else 'off'}, {tune}, "
            f"{'a frozen reference model (kl_coeff > 0)' if lay.reference_model else 'no reference model'}")


def _breakdown(lp: LearnerPlan) -> list[str]:
    lay, a = lp.layout, lp.activations
    s = f" / {lay.ranks} ranks" if lay.fsdp else ""
    rows = [
        ("parameters", lp.params, "offloaded to CPU" if lay.cpu_offload else f"P x weight bytes{s}"),
        ("gradients", lp.grads, "offloaded to CPU" if lay.cpu_offload else f"trainable P x weight bytes{s}"),
        ("AdamW state", lp.optim, "offloaded to CPU" if lay.cpu_offload else f"2 x trainable P x weight bytes{s}"),
    ]
    if lp.buckets:
        rows.append(("DDP gradient buckets", lp.buckets, "a flat copy of the gradients (num_learners > 1)"))
    if lp.gathered:
        rows.append(("FSDP gathered", lp.gathered, "2 blocks + 1 block's unsharded grads + the root group and its grads"))
    if lp.autocast_copy:
        rows.append(("autocast weight copy", lp.autocast_copy, "bf16 copies of the matmul weights (forward)"))
    pack = f"{a.rows} x {a.row_len} tokens{' padded' if a.padded else ''}"
    rows.append(("activations", a.total, f"worst packing {pack}: saved {_g(a.saved)} + held {_g(a.held)} + "
                 f"max(head phase {_g(a.head)}, block phase {_g(a.recompute + a.workspace)} = recomputed block "
                 f"{_g(a.recompute)} + gradient buffers {_g(a.workspace)})"))
    if lp.reference:
        rows.append(("reference model", lp.reference, "frozen policy copy (kl_coeff > 0)"))
    rows.append(("AdamW step temporaries", lp.step_temp, "foreach sqrt(exp_avg_sq); step phase only"))
    rows.append(("CUDA context/fragmentation", lp.overhead, f"fixed allowance ({OVERHEAD_GIB:g} GiB)"))
    out = [f"  {name:<27}{_g(b):>8}  {why}" for name, b, why in rows]
    out.append(f"  {'peak':<27}{_g(lp.total):>8}  max(forward/backward {_g(lp.fwd_bwd)}, AdamW step "
               f"{_g(lp.step)}) + allowance")
    if lp.cpu_ram_per_rank:
        out.append(f"  {'CPU RAM (offload)':<27}{_g(lp.cpu_ram_per_rank):>8}  per rank; "
                   f"{_g(lp.cpu_ram_per_node)} GiB per node of {min(lay.ranks, 8)} ranks (pinned)")
    return out


def _table(p: "MemoryPlan") -> list[str]:
    g = p.gpu_memory_gb
    head = ("| strategy | params | grads | AdamW | gathered / autocast copy | activations | reference "
            f"| total | CPU RAM/node | {'fits ' + format(g, 'g') + ' GiB' if g is not None else 'fits'} |")
    out = [head, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for i, lp in enumerate(p.alternatives):
        mark = "**" if i == 0 else ""
        star = " (this config)" if i == 0 else ""
        out.append(
            f"| {mark}{lp.layout.label()}{star}{mark} | {_g(lp.params)} | {_g(lp.grads + lp.buckets)} | "
            f"{_g(lp.optim)} | {_g(lp.gathered + lp.autocast_copy)} | {_g(lp.activations.total)} | "
            f"{_g(lp.reference)} | {_g(lp.total)} | {_g(lp.cpu_ram_per_node) if lp.cpu_ram_per_node else '-'} | "
            f"{_verdict(lp.fits(g)) if p.learner_on_gpu else '-'} |")
    return out


def _engine_lines(e: EnginePlan) -> list[str]:
    lay = e.layout
    head = (f"engine GPU: {lay.engine}, {lay.num_runners} runner(s) x {lay.gpus_per_runner:g} GPU, "
            f"tensor_parallel_size {lay.tensor_parallel}, {lay.dtype}")
    if not e.on_gpu:
        return [head + " (on CPU: num_gpus_per_env_runner=0)", f"  {'weights':<27}{_g(e.weights):>8}  in host memory"]
    if lay.engine != "vllm":
        return [head, f"  {'weights':<27}{_g(e.weights):>8}  P x dtype bytes; the HF engine's KV cache grows with "
                "the batch (not planned)"]
    out = [head + f", gpu_memory_utilization {lay.gpu_memory_utilization:g}"
           + (f" of {e.gpu_gib:g} GiB" if e.gpu_gib is not None else "")]
    out.append(f"  {'weights / tp':<27}{_g(e.weights):>8}  P x dtype bytes / tensor_parallel_size")
    out.append(f"  {'profile-run reserve':<27}{_g(e.reserve):>8}  max_num_batched_tokens {lay.max_num_batched_tokens} "
               f"activations, sampler logits of max_num_seqs {lay.max_num_seqs}, CUDA graphs")
    kvt = e.kv_bytes_per_token
    if e.gpu_gib is None:
        out.append(f"  KV cache: no GPU memory declared ({kvt / 1024:.0f} KiB per token: "
                   f"{kvt * lay.max_model_len / GIB:.2f} GiB per max_model_len {lay.max_model_len} sequence)")
    else:
        out.append(f"  {'KV cache':<27}{_g(max(0, e.kv_bytes)):>8}  {e.kv_tokens:,} tokens at {kvt / 1024:.0f} KiB/token = "
                   f"{e.sequences} concurrent sequences of max_model_len {lay.max_model_len}"
                   + (f" (each runner samples {lay.rollouts_per_runner} per iteration)" if lay.rollouts_per_runner else ""))
    return out


def format_plan(p: "MemoryPlan") -> str:
    """The report ``rllib-spear plan`` prints (GiB = 2**30 bytes)."""
    lp = p.learner
    lines = [f"model: {p.shape.summary()}", f"  from {p.model_source}" if p.model_source else ""]
    lines.append(f"learners: {_layout_words(lp.layout)}")
    lines.append(f"  micro_batch_token_budget {lp.micro_batch_token_budget}, max_model_len {p.max_model_len}")
    where = "learner GPU" if p.learner_on_gpu else "learner (num_gpus_per_learner=0: host memory)"
    lines.append(f"\nper {where}, GiB:")
    lines += _breakdown(lp)
    lines.append("\nstrategies per learner GPU, GiB (grads include DDP gradient buckets):\n")
    lines += _table(p)
    if p.engine is not None:
        lines.append("")
        lines += _engine_lines(p.engine)
    if p.colocated is not None:  # colocate=True: both residents of one GPU (planning/colocate.py)
        lines.append("")
        lines += p.colocated.lines()
    for n in p.notes:
        lines.append(f"note: {n}")
    lines.append("")
    lines += _verdict_lines(p)
    return "\n".join(x for x in lines if x is not None)


def _verdict_lines(p: "MemoryPlan") -> list[str]:
    """The verdict: each declared memory (learner GPU, engine GPU, learner node's host RAM) and
    whether the plan fits in it, then what to change for each part that does not."""
    lp, g = p.learner, p.gpu_memory_gb
    parts = []
    if p.learner_fits is not None:
        parts.append(f"learner {_g(lp.total)} of {g:g} GiB: {_verdict(p.learner_fits)}")
    if p.engine is not None and p.engine.fits is not None:
        e = p.engine
        what = (f"{e.sequences} sequences of {p.max_model_len} tokens in the KV cache" if e.layout.engine == "vllm"
                else f"weights {_g(e.weights)} GiB")
        parts.append(f"engine {what} on {e.gpu_gib:g} GiB: {_verdict(e.fits)}")
    c = p.colocated
    if c is not None and c.fits is not None:
        parts.append(f"colocated GPU: sampling {_g(max(c.sampling, c.sync))}, training {_g(c.training)} of "
                     f"{c.gpu_gib:g} GiB: {_verdict(c.fits)}")
    if p.host_fits is not None:
        parts.append(f"learner node host memory {_g(lp.cpu_ram_per_node)} GiB pinned (cpu_offload) of "
                     f"{p.host_memory_gb:g} GiB: {_verdict(p.host_fits)}")
    no_gpu = g is None and p.engine_gpu_memory_gb is None
    if not parts:
        return ["verdict: no GPU memory declared (set .learners(gpu_memory_gb=...) or --gpu-memory-gb)"]
    if no_gpu:
        parts.append("no GPU memory declared (--gpu-memory-gb)")
    return [f"verdict: {_verdict(p.fits)} ({'; '.join(parts)})"] + [f"  {m}" for m in p.problems()]


# ---------------------------------------------------------------------- fixes
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


def learner_fixes(p: "MemoryPlan") -> str:
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


def engine_fixes(p: "MemoryPlan") -> str:
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


def host_fixes(p: "MemoryPlan") -> str:
    """The host part of the verdict: the pinned ``cpu_offload`` state of a learner node exceeds
    ``host_memory_gb``; more learners (FSDP shards the state over every rank, 8 per node), or no
    offload with the fewest learner GPUs that hold the state."""
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
