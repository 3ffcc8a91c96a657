"""The text of a memory plan: what ``rllib-spear plan`` prints (:func:`format_plan`): the model,
the learner's terms, the strategies table, the engine, the colocated phases and the verdict with
what to change (``fixes.py``). Pure Python."""
from __future__ import annotations

from .engine import EnginePlan
from .fixes import plan_problems
from .layouts import GIB, OVERHEAD_GIB, LearnerLayout
from .layouts import gib_text as _g
from .learner import LearnerPlan
from .memory_plan import MemoryPlan

__all__ = ["format_plan"]


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
            f"{'a frozen reference model (kl_coeff > 0)' if lay.reference_model else 'no reference model'}"
            + (f", packed micro-batches ({lay.attention or 'sdpa'}"
               f"{': a dense N x N mask per layer' if lay.dense_packed_mask else ': no dense mask'})"
               if lay.packed else ""))


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
    if lay.packed:
        pack = f"1 packed row of {a.row_len} tokens{' (dense N x N mask)' if a.padded else ''}"
    else:
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


def _table(p: MemoryPlan) -> list[str]:
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


def format_plan(p: MemoryPlan) -> str:
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


def _verdict_lines(p: MemoryPlan) -> list[str]:
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
    if p.host_fits is not None and not p.learner_on_gpu:
        parts.append(f"CPU learners {_g(p.learner_host_bytes)} GiB of {p.host_memory_gb:g} GiB host memory: "
                     f"{_verdict(p.host_fits)}")
    elif p.host_fits is not None:
        parts.append(f"learner node host memory {_g(lp.cpu_ram_per_node)} GiB pinned (cpu_offload) of "
                     f"{p.host_memory_gb:g} GiB: {_verdict(p.host_fits)}")
    no_gpu = g is None and p.engine_gpu_memory_gb is None
    if not parts:
        return ["verdict: no GPU memory declared (set .learners(gpu_memory_gb=...) or --gpu-memory-gb)"]
    if no_gpu:
        parts.append("no GPU memory declared (--gpu-memory-gb)")
    return [f"verdict: {_verdict(p.fits)} ({'; '.join(parts)})"] + [f"  {m}" for m in plan_problems(p)]
