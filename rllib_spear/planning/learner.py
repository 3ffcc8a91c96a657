"""Learner memory per GPU: the activation peak of one micro batch (:func:`activation_peak`), the
packings a token budget allows (:func:`packing_cases`), :class:`LearnerPlan` /
:func:`plan_learner`, and the layouts tried instead (:func:`alternative_layouts`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..models.activations import Precision, block_saved_bytes, head_rows_per_chunk, saved_bytes
from ..models.shapes import ModelShape
from .layouts import GPUS_PER_NODE, OVERHEAD_GIB, GIB, LearnerLayout, dtype_bytes, _gib

# ---------------------------------------------------------------------- activations
@dataclass
class ActivationPeak:
    """Activation bytes of one learner GPU at the backward's peak, for one micro-batch.

    ``saved``: what autograd keeps (``models.activations.saved_bytes``) for the body; ``held``
    (checkpointing): the cos/sin tables and the boolean mask the checkpoints reference; ``head``:
    the head phase, which comes first in backward: what the head saved (freed by its backward,
    so not alive in the block phase), a chunk's logits plus about three float32 [rows, chunk, V]
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
                    chunk_size: int | None = None, padded: bool | None = None,
                    scored: int | None = None, varlen: bool = False) -> ActivationPeak:
    """Activations of one ``rows`` x ``row_len`` micro-batch (see ``ActivationPeak``).

    Head chunk: ``chunk = chunk_size or max(1, DEFAULT_CHUNK_ELEMENTS // (rows * V))`` positions
    per row (models/logprobs.py); the head scores at most N = rows * (row_len - 1) gathered
    positions (``scored`` when given: a measurement's exact count), rows * chunk per chunk:
    E = min(rows * chunk, N) * V elements. With F = V * h * f the
    fresh gradient of a trained head per chunk (f = c bytes, + 4 under autocast: its cast to the
    float32 weight), S = F when several chunks (or tied embeddings) make autograd hold a summed
    one, and R = E * c the logits a checkpointed chunk recomputes (several chunks; one chunk's are
    saved, not recomputed: R = 0), the head phase is R + max(E * 12 + S, F + S)
    + (tokens + N) * h * x (x: the residual stream's bytes; the full-length and the gathered
    hidden-state gradients) and the block phase recompute + tokens * (2 * h * x + i * c)
    (+ F when tied)."""
    padded = rows > 1 if padded is None else padded
    full_finetune = not lora if full_finetune is None else full_finetune
    la = _lora_args(shape, lora)
    scored = rows * max(0, row_len - 1) if scored is None else int(scored)  # default: the most
    sb = saved_bytes(shape, prec, rows=rows, row_len=row_len, checkpointing=checkpointing, padded=padded,
                     scored=scored, chunk_size=chunk_size, varlen=varlen, **la)
    tokens = rows * row_len
    cb = prec.compute_bytes
    x_bytes = prec.weight_bytes  # the residual stream keeps the embeddings' dtype
    held = recompute = 0
    if checkpointing:
        held = tokens * 2 * shape.head_dim * x_bytes + (tokens * row_len if padded else 0)
        # sized as a trained block even under LoRA: a frozen layer keeps less, but its backward
        # allocates the same input gradients (measured: LoRA's block phase is the full one's)
        recompute = block_saved_bytes(shape, prec, rows=rows, row_len=row_len, padded=padded,
                                      varlen=varlen).activations
    per_chunk = head_rows_per_chunk(shape, rows, chunk_size)
    elems = max(1, min(per_chunk, scored)) * shape.vocab
    # the chunk's logits + ~3 float32 buffers (log-softmax temporaries / its gradient), or, in the
    # head's own backward, the logits gradient + the chunk's fresh V x h weight gradient. Autograd
    # sums the contributions to one weight in the AccumulateGrad node's input buffer until the
    # last has arrived, so with several chunks (or a head tied to the embeddings, whose gradient
    # comes last) one V x h sum stays alive beside them.
    fresh = shape.vocab * shape.hidden * (cb + (4 if prec.autocast else 0)) if full_finetune else 0
    n_chunks = max(1, -(-scored // per_chunk))
    pending = fresh if (n_chunks > 1 or shape.tied) else 0
    # one chunk is not checkpointed: its logits are among the saved tensors, not recomputed here
    recomputed_logits = elems * cb if n_chunks > 1 else 0
    head = recomputed_logits + max(elems * 12 + pending, fresh + pending)
    # the full-length hidden-state gradient and the gathered positions' one it is scattered from
    grad_hidden = (tokens + scored) * shape.hidden * x_bytes
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
    # the head's saved tensors are freed by its backward, before any block's: head phase only
    head_saved = int(round(sb.per_scored * sb.scored))
    return ActivationPeak(rows, row_len, padded, sb.activations - head_saved, held, recompute,
                          head_saved + head + grad_hidden, workspace, elems, copies)


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

    def host_fits(self, host_gib: float | None) -> bool | None:
        """Whether a node's pinned ``cpu_offload`` state fits in ``host_gib`` of host RAM (None
        when nothing is offloaded or no host memory is given)."""
        if host_gib is None or not self.cpu_ram_per_node:
            return None
        return _gib(self.cpu_ram_per_node) <= host_gib


def packed_cases(budget: int, max_len: int) -> list[tuple[int, int]]:
    """(rows, row length) of ``packed_microbatches`` micro-batches: the real tokens of rows whose
    lengths sum to at most the budget, in one row of up to ``budget`` tokens (a packed row may be
    longer than any single row); one row of ``max_len`` when a row alone exceeds the budget.
    Measured on CPU, a packed sdpa micro-batch of N real tokens saves what one padded-mask row of
    N tokens does (``activation_peak(rows=1, row_len=N, padded=True)``: the N x N float bias per
    layer; tests/test_planner.py)."""
    out = [(1, max(1, budget))]
    if max_len > budget:
        out.append((1, max_len))
    return out


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
    if layout.packed:  # one row of up to the budget's real tokens: a dense mask under sdpa/eager
        cases, padded = packed_cases(micro_batch_token_budget, max_model_len), layout.dense_packed_mask
    else:
        cases, padded = packing_cases(micro_batch_token_budget, max_model_len), None
    varlen = layout.packed and layout.attention == "sdpa_varlen"
    acts = max((activation_peak(shape, prec, rows=r, row_len=t, checkpointing=layout.activation_checkpointing,
                                lora=lora, chunk_size=chunk_size, padded=padded, varlen=varlen)
                for r, t in cases), key=lambda a: a.total + a.autocast_weights)
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
