"""Bytes autograd saves for the backward pass of a Llama-family decoder (no torch).

``saved_bytes`` replays, symbolically, the forward of ``models.logprobs.token_logprobs`` on a Hugging
Face Llama / Qwen2 / Qwen3 model with SDPA attention, op by op, and records every tensor an op keeps
for its backward, under autograd's rules:

* ``a * b`` keeps ``b`` when ``a`` needs a gradient and ``a`` when ``b`` does (so RoPE's
  ``q * cos`` keeps only the shared cos/sin tables, never q);
* ``linear(x, W)`` keeps its (cast) input when W is trainable (for dW; a frozen LoRA base layer
  keeps none), and its weight when x needs a gradient;
* RMSNorm (HF: ``x.float()``, ``pow(2).mean``, ``rsqrt``, ``x * r``, ``w * n.to(dtype)``) keeps the
  float32 input, the per-row ``rsqrt`` and the cast normalised input;
* SDPA keeps q, k, v, the output (which ``o_proj`` reuses: the kernels write it in the
  [B, T, H, d] layout, so ``transpose(1, 2).contiguous()`` copies nothing) and the float32
  log-sum-exp per head; with padding (a boolean mask) HF repeats k and v to all H heads
  (``repeat_kv``) and SDPA converts the mask into a float bias of the compute dtype, [B, 1, T, T],
  per layer: T elements per token;
* SiLU keeps its input; ``act * up`` keeps both; ``down_proj`` keeps the product.

Under ``torch.autocast`` (bf16 over float32 weights: replicated learners with
``mixed_precision="bf16"``) every linear and SDPA input is cast to bf16 per call (a new copy, kept
when the op keeps its input), the residual stream and the norms stay float32, and the bf16 weight
copies a linear keeps are returned separately (``weight_copies``). With LoRA
(``lora_targets``/``lora_r``) only the adapters train: peft's ``lora_B(lora_A(x))`` keeps x (cast to
the adapter dtype) and the r-wide ``lora_A`` output.

Per token and layer (no mask, no autocast, full fine-tune, b = compute bytes, h hidden, q = H*d,
kv = K*d, i intermediate) this gives::

    2 * (4h + 4 + b*h)      two RMSNorms: float32 input, rsqrt, cast normalised input
    + 2 * b*h               the two norm outputs the projections keep
    + b * (2q + 2kv)        SDPA q, k, v, output
    + 4 * H                 log-sum-exp
    + 4 * b*i               MLP: gate, silu(gate), up, product

The output head scores only the gathered positions of ``score_mask`` (N of them, default every
position with a left context): checkpointed when they span more than one chunk (the checkpoint
keeps the gathered [N, h] hidden states and [N] targets), else not (the head linear's input, the
[N, V] logits and three [N] vectors); plus the [B, T] bool mask (``_head_saved``).

With activation checkpointing (HF ``gradient_checkpointing_enable``, non-reentrant) a block keeps
only its input hidden states; the cos/sin tables and the boolean mask stay referenced by the
checkpoint and the block's tensors exist again while it is recomputed in the backward pass.
Checked against ``torch.autograd.graph.saved_tensors_hooks`` by tests/test_planner.py and
benchmarks/planner_accuracy.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from .shapes import ModelShape

__all__ = ["Precision", "SavedBytes", "saved_bytes", "block_saved_bytes", "head_rows_per_chunk",
           "DEFAULT_CHUNK_ELEMENTS"]

#: Default chunk budget of ``token_logprobs``'s output head: float32 logits elements per chunk
#: (2**24 = 64 MB). Its home is here, torch-free, so that the planner reads the same value.
DEFAULT_CHUNK_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class Precision:
    """How a forward computes.

    ``weight_bytes``: bytes per element of the weights the forward reads (4 for float32, 2 for
    bf16: FSDP's bf16 all-gather, or bf16 storage); ``autocast``: ``torch.autocast(bf16)`` over
    float32 weights (replicated learners with ``mixed_precision="bf16"``); ``gathered``: the bf16
    weights are FSDP's all-gathered copies of float32 master weights (adapters included)."""

    weight_bytes: int = 4
    autocast: bool = False
    gathered: bool = False

    @property
    def compute_bytes(self) -> int:
        """Bytes of matmul / attention outputs."""
        return 2 if self.autocast else self.weight_bytes

    @property
    def adapter_bytes(self) -> int:
        """LoRA adapters compute in: bf16 under autocast and FSDP's bf16 gather; float32 on float32
        weights, and on bf16 weights too (peft's ``autocast_adapter_dtype`` upcasts them)."""
        return 2 if self.autocast or self.gathered else 4

    @classmethod
    def of(cls, *, weight_dtype_bytes: int, mixed_precision: str | None, sharded: bool) -> "Precision":
        """The precision of a learner layout: FSDP + bf16 gathers bf16 weights; replicated + bf16
        autocasts float32 weights; no mixed precision computes in the storage dtype."""
        if mixed_precision == "bf16":
            return cls(weight_bytes=2, gathered=True) if sharded else cls(weight_bytes=4, autocast=True)
        return cls(weight_bytes=weight_dtype_bytes, autocast=False)


@dataclass
class SavedBytes:
    """Saved-for-backward bytes of one micro-batch (``rows`` x ``row_len`` padded tokens)."""

    tokens: int
    per_token: float  # bytes per token of activations (including the per-layer mask bias)
    weight_copies: int  # autocast bf16 weight copies kept for backward (bytes, not per token)
    scored: int = 0  # positions the output head scores
    per_scored: float = 0.0  # bytes the head keeps per scored position (``_head_saved``)

    @property
    def activations(self) -> int:
        return int(round(self.per_token * self.tokens + self.per_scored * self.scored))

    @property
    def total(self) -> int:
        return self.activations + self.weight_copies


# ---------------------------------------------------------------------- the symbolic trace
@dataclass
class _T:
    elems: int  # elements per token
    nbytes: int  # bytes per element
    rg: bool  # requires grad
    sid: int  # storage id


@dataclass
class _Trace:
    prec: Precision
    lora_targets: frozenset = frozenset()
    lora_r: int = 0
    lora_dropout: bool = False
    saved: dict = field(default_factory=dict)  # storage id -> bytes per token
    weight_copies: int = 0
    hidden: _T | None = None  # the final norm's output (set by ``_trace``)
    _next: int = 0

    def new(self, elems: int, nbytes: int, rg: bool) -> _T:
        self._next += 1
        return _T(elems, nbytes, rg, self._next)

    def keep(self, *ts: _T) -> None:
        for t in ts:
            self.saved.setdefault(t.sid, t.elems * t.nbytes)

    def cast(self, x: _T, nbytes: int) -> _T:
        return x if x.nbytes == nbytes else self.new(x.elems, nbytes, x.rg)

    # ---- ops
    def rmsnorm(self, x: _T, groups: int, w_trainable: bool) -> _T:
        x32 = self.cast(x, 4)
        r = self.new(groups, 4, x.rg)
        if x.rg:
            self.keep(x32, r)  # pow / x * r keep the float32 input; rsqrt and x * r keep r
        n = self.cast(self.new(x.elems, 4, x.rg), x.nbytes)  # .to(input_dtype)
        if w_trainable:
            self.keep(n)  # dL/dw needs the normalised input
        w_bytes = self.prec.weight_bytes
        return self.new(x.elems, max(w_bytes, n.nbytes), w_trainable or n.rg)

    def linear(self, x: _T, name: str, in_f: int, out_f: int, trainable: bool) -> _T:
        p = self.prec
        xc = self.new(x.elems, 2, x.rg) if p.autocast and x.nbytes != 2 else x  # per-call cast
        if trainable:
            self.keep(xc)
        if p.autocast and xc.rg:
            self.weight_copies += in_f * out_f * 2  # the bf16 weight copy backward multiplies by
        y = self.new(out_f, p.compute_bytes, x.rg or trainable)
        if name in self.lora_targets:
            xa = x
            if self.lora_dropout:
                xa = self.new(x.elems, x.nbytes, x.rg)
                self.saved.setdefault(self.new(x.elems, 1, False).sid, x.elems)  # dropout mask
            xa = self.new(x.elems, p.adapter_bytes, x.rg) if (p.autocast or xa.nbytes != p.adapter_bytes) else xa
            a = self.new(self.lora_r, p.adapter_bytes, True)
            self.keep(xa, a)  # lora_A keeps its input, lora_B lora_A's output
            if p.autocast:  # and each its adapter's bf16 copy when its input needs grad
                self.weight_copies += 2 * self.lora_r * (in_f * x.rg + out_f)
            y = self.new(out_f, p.compute_bytes, True)
        return y

    def mul(self, a: _T, b: _T) -> _T:
        if a.rg:
            self.keep(b)
        if b.rg:
            self.keep(a)
        return self.new(max(a.elems, b.elems), max(a.nbytes, b.nbytes), a.rg or b.rg)

    def add(self, a: _T, b: _T) -> _T:
        return self.new(max(a.elems, b.elems), max(a.nbytes, b.nbytes), a.rg or b.rg)


def _block(tr: _Trace, s: "ModelShape", x: _T, cos: _T, sin: _T, mask_len: int, train_base: bool,
           varlen: bool = False) -> _T:
    p = tr.prec
    lin = s.linear_shapes()

    def linear(t: _T, name: str) -> _T:
        return tr.linear(t, name, *lin[name], trainable=train_base)

    a1 = tr.rmsnorm(x, 1, train_base)
    q, k, v = linear(a1, "q_proj"), linear(a1, "k_proj"), linear(a1, "v_proj")
    if s.qk_norm:
        q, k = tr.rmsnorm(q, s.heads, train_base), tr.rmsnorm(k, s.kv_heads, train_base)
    # RoPE: (q * cos) + (rotate_half(q) * sin); cos/sin need no grad, so only they are kept
    q = tr.add(tr.mul(q, cos), tr.mul(tr.new(q.elems, q.nbytes, q.rg), sin))
    k = tr.add(tr.mul(k, cos), tr.mul(tr.new(k.elems, k.nbytes, k.rg), sin))
    if (mask_len or varlen) and s.kv_heads != s.heads:  # repeat_kv: a mask (or sdpa_varlen) repeats k/v
        k, v = tr.new(s.q_width, k.nbytes, k.rg), tr.new(s.q_width, v.nbytes, v.rg)
    cb = p.compute_bytes
    qc, kc, vc = (tr.new(t.elems, cb, t.rg) if t.nbytes != cb else t for t in (q, k, v))
    out = tr.new(s.q_width, cb, True)
    if qc.rg or kc.rg or vc.rg:
        tr.keep(qc, kc, vc, out, tr.new(s.heads, 4, False))  # + float32 log-sum-exp per head
        if mask_len:
            tr.keep(tr.new(mask_len, cb, False))  # the boolean mask as a float bias, per call
    if varlen:  # sdpa_varlen: each document's output is its own storage; o_proj gets their concatenation
        out = tr.new(s.q_width, cb, out.rg)
    o = linear(out, "o_proj")
    h1 = tr.add(x, o)
    a2 = tr.rmsnorm(h1, 1, train_base)
    gate, up = linear(a2, "gate_proj"), linear(a2, "up_proj")
    if gate.rg:
        tr.keep(gate)  # SiLU keeps its input
    act = tr.new(gate.elems, gate.nbytes, gate.rg)
    down = linear(tr.mul(act, up), "down_proj")
    return tr.add(h1, down)


def _trace(shape: "ModelShape", prec: Precision, *, checkpointing: bool, mask_len: int,
           lora_targets: Iterable[str], lora_r: int, lora_dropout: bool, layers: int | None,
           varlen: bool = False) -> _Trace:
    tr = _Trace(prec, frozenset(lora_targets), lora_r, lora_dropout)
    lora = bool(tr.lora_targets)
    train_base = not lora
    ids = tr.new(1, 8, False)
    if train_base:
        tr.keep(ids)  # the embedding's backward indexes by the ids
    # HF's enable_input_require_grads (LoRA + checkpointing) makes the embeddings' output need grad.
    x = tr.new(shape.hidden, prec.weight_bytes, train_base or (lora and checkpointing))
    cos, sin = tr.new(shape.head_dim, x.nbytes, False), tr.new(shape.head_dim, x.nbytes, False)
    for _ in range(shape.layers if layers is None else layers):
        if checkpointing:
            tr.keep(x)  # the checkpoint keeps the block's input; the block is recomputed
            x = tr.new(x.elems, x.nbytes, True)  # the residual stream keeps the embeddings' dtype
        else:
            x = _block(tr, shape, x, cos, sin, mask_len, train_base, varlen)
    tr.hidden = tr.rmsnorm(x, 1, train_base)
    if tr.hidden.rg or train_base:
        tr.keep(tr.new(1, 1, False))  # the [B, T] bool scored-target mask masked_scatter keeps
    return tr


def _head_saved(shape: "ModelShape", prec: Precision, hidden: _T, *, train_head: bool,
                checkpointed: bool) -> tuple[float, int]:
    """(bytes per scored position, weight-copy bytes) the output head keeps.

    ``token_logprobs`` gathers the hidden states of the scored positions into an [N, h] matrix
    and their targets into an [N] int64 vector (new storages). Checkpointed (several chunks):
    the checkpoint keeps exactly these two, per position ``h * x + 8`` (x: the hidden states'
    bytes). Not checkpointed (one chunk): the head linear keeps its input (when it trains; cast
    to bf16 under autocast) and the fused log-softmax keeps the logits (compute bytes c), the
    targets and two float32 [N] vectors (log-sum-exp, entropy): ``h * x + V * c + 8 + 8``."""
    if not (hidden.rg or train_head):
        return 0.0, 0
    tr = _Trace(prec)
    h = tr.new(hidden.elems, hidden.nbytes, hidden.rg)  # the gathered [N, h] rows
    targets = tr.new(1, 8, False)
    if checkpointed:
        tr.keep(h, targets)
    else:
        logits = tr.linear(h, "lm_head", shape.hidden, shape.vocab, trainable=train_head)
        tr.keep(logits, targets, tr.new(1, 4, False), tr.new(1, 4, False))
    return float(sum(tr.saved.values())), tr.weight_copies


def head_rows_per_chunk(shape: "ModelShape", rows: int, chunk_size: int | None = None) -> int:
    """Gathered positions per head chunk in ``token_logprobs``: ``rows * chunk`` with
    ``chunk = chunk_size or max(1, DEFAULT_CHUNK_ELEMENTS // (rows * V))`` (models/logprobs.py)."""
    chunk = int(chunk_size) if chunk_size else max(1, DEFAULT_CHUNK_ELEMENTS // max(1, rows * shape.vocab))
    return max(1, rows * chunk)


def saved_bytes(shape: "ModelShape", prec: Precision, *, rows: int, row_len: int,
                checkpointing: bool = False, padded: bool | None = None,
                lora_targets: Iterable[str] = (), lora_r: int = 0, lora_dropout: bool = False,
                layers: int | None = None, scored: int | None = None,
                chunk_size: int | None = None, varlen: bool = False) -> SavedBytes:
    """What autograd keeps after ``token_logprobs`` runs forward on ``rows`` x ``row_len`` tokens.

    ``padded`` (default: ``rows > 1``): the micro-batch has padding, so HF passes SDPA a boolean
    mask (T = ``row_len`` float bias elements per token and layer, k/v repeated to all heads);
    without padding HF passes no mask (``is_causal``, GQA inside SDPA). ``layers`` limits the trace
    to the first blocks (tests). ``scored``: the positions the head scores (a learner's loss
    tokens); default ``rows * (row_len - 1)``, every position with a left context, the most a
    micro-batch can score. ``chunk_size``: ``token_logprobs``' head chunk (default: its own); the
    head is checkpointed, and keeps less, when the scored positions span more than one chunk
    (``_head_saved``). ``varlen``: a packed row under ``attn_implementation="sdpa_varlen"``
    (models/varlen_attention.py): no mask, k/v repeated to all heads, and the documents'
    outputs concatenated into a second q-wide tensor per layer (pass ``padded=False``)."""
    padded = rows > 1 if padded is None else padded
    tr = _trace(shape, prec, checkpointing=checkpointing, mask_len=row_len if padded else 0,
                lora_targets=lora_targets, lora_r=lora_r, lora_dropout=lora_dropout, layers=layers, varlen=varlen)
    n = rows * max(0, row_len - 1) if scored is None else int(scored)
    if n < 0:
        raise ValueError(f"scored={scored}: the number of scored positions must be >= 0")
    per_scored, head_copies = _head_saved(shape, prec, tr.hidden, train_head=not tr.lora_targets,
                                          checkpointed=n > head_rows_per_chunk(shape, rows, chunk_size))
    return SavedBytes(tokens=rows * row_len, per_token=float(sum(tr.saved.values())),
                      weight_copies=tr.weight_copies + (head_copies if n else 0), scored=n,
                      per_scored=per_scored)


def block_saved_bytes(shape: "ModelShape", prec: Precision, *, rows: int, row_len: int,
                      padded: bool | None = None, lora_targets: Iterable[str] = (), lora_r: int = 0,
                      lora_dropout: bool = False, varlen: bool = False) -> SavedBytes:
    """One block's saved tensors (input needing grad, shared cos/sin excluded): what exists while
    activation checkpointing recomputes it in the backward pass."""
    padded = rows > 1 if padded is None else padded
    tr = _Trace(prec, frozenset(lora_targets), lora_r, lora_dropout)
    x_bytes = 4 if prec.autocast else prec.weight_bytes
    x = tr.new(shape.hidden, x_bytes, True)
    cos, sin = tr.new(shape.head_dim, x_bytes, False), tr.new(shape.head_dim, x_bytes, False)
    _block(tr, shape, x, cos, sin, row_len if padded else 0, not tr.lora_targets, varlen)
    for t in (x, cos, sin):  # already kept by the checkpoint (x) or once per micro-batch
        tr.saved.pop(t.sid, None)
    return SavedBytes(tokens=rows * row_len, per_token=float(sum(tr.saved.values())),
                      weight_copies=tr.weight_copies)
