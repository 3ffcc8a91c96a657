"""Per-token log-probs (and entropies) of a causal LM without materialising [B, T, V] logits.

``token_logprobs`` runs the transformer body once, gathers the hidden states of the scored
positions (``score_mask``: a learner's loss tokens; default every position), then applies the
output head and the log-softmax to chunks of them. When there is more than one chunk, each runs
under non-reentrant activation checkpointing, so autograd keeps only the chunk's hidden states and
recomputes the chunk's logits in the backward pass; a fused autograd function turns a chunk's logits into log-probs/entropies and
back into the logits gradient with about three [B, chunk, V] buffers alive. Peak memory is then a
few chunks of float32 logits instead of several copies of the whole sequence's (measured: 0.26x
the naive peak, benchmarks/logprob_memory.py). Gradients are those of the naive computation
(``naive_token_logprobs``), checked in tests/models/test_logprobs.py.

Packed rows (``packed=True``, docs/design.md "Packed micro-batches"): the body runs once over the
real tokens of every row packed into one row [1, N] with per-row restarting positions
(``models.packing``), and its hidden states are put back at their [B, T] places before the head:
the same outputs as the padded body, without the padding's FLOPs.

Alignment (shared with ``rllib_spear.core.trajectory``): position t holds log p(x_t | x_<t) under
softmax(logits / temperature). Positions without a real left context hold 0: position 0, padding
(``attention_mask == 0``), and the first real token of a left-padded row.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .activations import DEFAULT_CHUNK_ELEMENTS  # the planner's value too (torch-free home)

__all__ = ["token_logprobs", "naive_token_logprobs", "position_ids_from_mask", "unwrap_causal_lm", "body_and_head"]


def lm_vocab(model) -> int:
    return int(unwrap_causal_lm(model).config.vocab_size)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """RoPE positions that ignore left padding (what ``generate`` uses): cumsum(mask) - 1."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_(min=0)


def unwrap_causal_lm(model):
    """The underlying ``*ForCausalLM`` of a PEFT-wrapped model (or the model itself)."""
    if hasattr(model, "get_base_model"):  # peft.PeftModel
        model = model.get_base_model()
    return model


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32, or float64 when it is float64: the log-softmax runs in at least float32
    (bf16 / fp16 logits are upcast), and a float64 model is scored in float64 end to end (the
    float64 checks of tests/models/test_logprobs_gather.py need it)."""
    return x if x.dtype == torch.float64 else x.float()


def _valid_targets(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: token t is real and has a real token before it."""
    m = attention_mask.bool()
    valid = torch.zeros_like(m)
    valid[:, 1:] = m[:, 1:] & m[:, :-1]
    return valid


class _LogpEntropy(torch.autograd.Function):
    """(logits [B, c, V], targets [B, c]) -> (log p(target), entropy) under softmax(logits / T).

    Saves only the logits and the [B, c] normaliser; the backward builds the logits gradient in
    one buffer (p * (-g_logp - g_ent * (log p + H)), plus g_logp at the target) instead of the
    four or five [B, c, V] temporaries autograd would keep for log_softmax/gather/entropy.
    """

    @staticmethod
    def forward(ctx, logits, targets, temperature: float, want_entropy: bool):
        z = _upcast(logits)
        if temperature != 1.0:
            z = z / temperature
        lse = torch.logsumexp(z, dim=-1)
        logp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
        if want_entropy:
            ent = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
        else:
            ent = torch.zeros_like(lse)
        ctx.save_for_backward(logits, targets, lse, ent)
        ctx.temperature = temperature
        ctx.want_entropy = want_entropy
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        logits, targets, lse, ent = ctx.saved_tensors
        T = ctx.temperature
        if g_logp is not None and not (ctx.want_entropy and g_ent is not None):
            # log-probs only (the learner's usual case): dL/dz = g * (onehot(target) - p), in
            # one [*, V] buffer and two passes over it (p = exp(z - lse), then * -g)
            z = _upcast(logits)
            buf = (z / T if T != 1.0 else z) - lse.unsqueeze(-1)
            buf.exp_().mul_(-g_logp.unsqueeze(-1))
            buf.scatter_add_(-1, targets.unsqueeze(-1), g_logp.unsqueeze(-1))
            if T != 1.0:
                buf.div_(T)
            return buf.to(logits.dtype), None, None, None
        buf = _upcast(logits)
        buf = buf.clone() if buf is logits else buf
        if T != 1.0:
            buf.div_(T)
        buf.sub_(lse.unsqueeze(-1))  # log p
        p = buf.exp()
        if g_logp is None:
            g_logp = torch.zeros_like(lse)
        if ctx.want_entropy and g_ent is not None:
            # dH/dz = -p * (log p + H)
            buf.add_(ent.unsqueeze(-1)).mul_(-g_ent.unsqueeze(-1)).sub_(g_logp.unsqueeze(-1))
        else:
            buf.copy_(-g_logp.unsqueeze(-1).expand_as(buf))
        buf.mul_(p)
        del p
        buf.scatter_add_(-1, targets.unsqueeze(-1), g_logp.unsqueeze(-1))
        if T != 1.0:
            buf.div_(T)
        return buf.to(logits.dtype), None, None, None


def _chunk_stats(head, hidden, targets, temperature: float, want_entropy: bool):
    logits = head(hidden)
    logp, ent = _LogpEntropy.apply(logits, targets, float(temperature), bool(want_entropy))
    return logp, (ent if want_entropy else None)


def _chunk_logp(head, hidden, targets, temperature):
    return _chunk_stats(head, hidden, targets, temperature, False)[0]


def _chunk_logp_ent(head, hidden, targets, temperature):
    return _chunk_stats(head, hidden, targets, temperature, True)


def _chunk_logp_metric(head, hidden, targets, temperature, metric_rows):
    """Log-probs of a chunk and, detached, the entropy of its rows ``metric_rows`` (bool [c]) from
    the same logits: the entropy metric's sample costs no second head matmul; 0 on other rows."""
    logits = head(hidden)
    logp, _ = _LogpEntropy.apply(logits, targets, float(temperature), False)
    with torch.no_grad():
        vals = _entropy_rows(logits.detach()[metric_rows], temperature)
        ent = vals.new_zeros(logits.shape[0])
        ent[metric_rows] = vals
    return logp, ent


def _entropy_rows(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """H = logsumexp(z) - sum softmax(z) * z per row, z = logits / T (upcast to float32 at least)."""
    z = _upcast(logits)
    if temperature != 1.0:
        z = z / temperature
    return torch.logsumexp(z, -1) - (torch.softmax(z, -1) * z).sum(-1)


def body_and_head(model):
    """(decoder body, output head) of a causal LM, for running the head on chosen positions only;
    refuses models whose logits are more than ``head(body(x))`` (soft-capping, a logit scale)."""
    lm = unwrap_causal_lm(model)
    head = lm.get_output_embeddings()
    body = getattr(lm, lm.base_model_prefix, None)
    if head is None or body is None:
        raise TypeError(f"{type(lm).__name__} has no output head / decoder body to run in chunks")
    if getattr(lm.config, "final_logit_softcapping", None):
        raise NotImplementedError("final_logit_softcapping models are not supported by the chunked path")
    scale = getattr(lm.config, "logit_scale", None)
    if scale not in (None, 1, 1.0):
        raise NotImplementedError("logit_scale models are not supported by the chunked path")
    return body, head


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    return_entropy: bool = False,
    position_ids: torch.Tensor | None = None,
    score_mask: torch.Tensor | None = None,
    entropy_mask: torch.Tensor | None = None,
    packed: bool = False,
):
    """Log-prob of every (scored) token given its prefix (see ``_token_logprobs_unsharded``).

    An FSDP-sharded LM (``models.sharding.shard_causal_lm``) is scored through its registered
    ``score_tokens`` forward method, so that its root parameters are gathered around the body and
    every head chunk; any other model directly.
    """
    from .sharding import SCORING_METHOD

    kwargs = dict(temperature=temperature, chunk_size=chunk_size, return_entropy=return_entropy,
                  position_ids=position_ids, score_mask=score_mask, entropy_mask=entropy_mask, packed=packed)
    scorer = getattr(unwrap_causal_lm(model), SCORING_METHOD, None)
    if scorer is not None:
        return scorer(input_ids, attention_mask, **kwargs)
    return _token_logprobs_unsharded(model, input_ids, attention_mask, **kwargs)


def _token_logprobs_unsharded(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    return_entropy: bool = False,
    position_ids: torch.Tensor | None = None,
    score_mask: torch.Tensor | None = None,
    entropy_mask: torch.Tensor | None = None,
    packed: bool = False,
):
    """Log-prob of every scored token given its prefix, computed head-chunk by head-chunk.

    Only the positions that are scored go through the output head: the hidden states h_{t-1} of
    the scored targets t are gathered into one [N, h] matrix (N = scored tokens of the whole
    batch), scored in chunks of ``B * chunk_size`` rows, and scattered back into the [B, T]
    layout, so a learner pays the head (the largest matmul of a small model, and the only
    [*, V] buffers) for its loss tokens only, not for prompt, observation and padding tokens.

    Args:
        model: a HF ``*ForCausalLM`` (optionally PEFT-wrapped).
        input_ids, attention_mask: [B, T]; left or right padding (RoPE positions come from the
            mask, so a left-padded row scores like the unpadded one).
        temperature: scores under softmax(logits / temperature).
        chunk_size: positions per row and head chunk (a chunk holds ``B * chunk_size`` gathered
            positions: the float32 logits alive at once are [B * chunk_size, V]); default: as
            many as fit ``DEFAULT_CHUNK_ELEMENTS`` logits.
        return_entropy: also return the entropy of the next-token distribution that produced
            token t, at position t (same alignment and zeros as the log-probs), with gradient.
        score_mask: [B, T], nonzero where position t is scored (a learner passes its loss mask);
            default: every position with a real left context. Unscored positions hold 0.
        entropy_mask: [B, T], nonzero where a detached (no-gradient) entropy is wanted without
            ``return_entropy`` (the entropy metric's sample); those positions need not be scored
            (when all of them are, the entropy comes from the scoring chunks' logits, with no
            second pass of the head).
        packed: run the body over the real tokens only, packed into one row with a
            block-diagonal causal mask (``models.packing``; the model must pass
            ``packing.check_packable``; positions come from the mask, so ``position_ids`` must
            be None). The outputs equal the padded ones (tests/models/test_packed_logprobs.py).

    Returns:
        ``logp`` [B, T] float32, or ``(logp, entropy)`` when ``return_entropy`` or
        ``entropy_mask`` is given.

    Activation checkpointing of the head: only when the gathered positions span more than one
    chunk. Without it every chunk's logits would stay saved until the backward pass; with a
    single chunk the saved logits are exactly what the checkpointed backward would recompute,
    so the peak is the same (one chunk's logits and its three float32 buffers, what the
    learner memory plan counts: rllib_spear/planning/learner.py) and the recomputation is
    skipped.
    """
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    body, head = body_and_head(model)
    if packed:
        hidden = _packed_hidden(model, body, input_ids, attention_mask, position_ids)
    else:
        if position_ids is None:
            position_ids = position_ids_from_mask(attention_mask)
        hidden = _last_hidden(body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                   use_cache=False))
    B, T = input_ids.shape
    vocab = head.weight.shape[0] if hasattr(head, "weight") else lm_vocab(model)
    if chunk_size is None:
        chunk_size = max(1, DEFAULT_CHUNK_ELEMENTS // max(1, B * vocab))
    rows_per_chunk = max(1, B * int(chunk_size))
    valid = _valid_targets(attention_mask)
    scored = valid if score_mask is None else valid & score_mask.bool()
    # hidden[:, t] predicts token t + 1: target position t (t >= 1) reads hidden[:, t - 1]
    sel = scored[:, 1:]
    h = hidden[:, :-1][sel]
    targets = input_ids[:, 1:][sel]
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
    if grad and h.shape[0] == 0:
        # Nothing to score (a fully masked dummy row of a DDP / FSDP rank without rows): score
        # one position at weight 0 below so that the backward still reaches every parameter.
        h, targets, keep = hidden[:1, :1].reshape(1, -1), input_ids[:1, :1].reshape(1), False
    else:
        keep = True
    n = h.shape[0]
    ckpt = grad and n > rows_per_chunk
    # The entropy metric's sample, when it lies on scored positions (a learner samples its loss
    # tokens), is read off the scoring chunks' logits; otherwise it takes its own head pass.
    metric = None
    if entropy_mask is not None and not return_entropy:
        wanted = valid & entropy_mask.bool()
        if keep and not bool((wanted & ~scored).any()):
            metric = wanted[:, 1:][sel]
    logps, ents = [], []
    for s in range(0, n, rows_per_chunk):
        hc, tc = h[s : s + rows_per_chunk], targets[s : s + rows_per_chunk]
        if metric is not None:
            fn, args = _chunk_logp_metric, (head, hc, tc, float(temperature), metric[s : s + rows_per_chunk])
        else:
            fn, args = (_chunk_logp_ent if return_entropy else _chunk_logp), (head, hc, tc, float(temperature))
        res = checkpoint(fn, *args, use_reentrant=False) if ckpt else fn(*args)
        if return_entropy or metric is not None:
            res, en = res
            ents.append(en)
        logps.append(res)
    logp = _scatter(logps, sel, keep)
    ent = None
    if return_entropy or metric is not None:
        ent = _scatter(ents, sel, keep)
    elif entropy_mask is not None:
        ent = _detached_entropy(head, hidden, valid & entropy_mask.bool(), float(temperature), rows_per_chunk)
    return logp if ent is None else (logp, ent)


def _last_hidden(out) -> torch.Tensor:
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def _packed_hidden(model, body, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   position_ids: torch.Tensor | None) -> torch.Tensor:
    """[B, T, h] hidden states of the body run once over the packed real tokens (zeros at
    padding, which no scored position reads): ``attention_mask=None`` and positions restarting
    per row make transformers build the block-diagonal causal mask (``models.packing``)."""
    from .packing import check_packable, pack_rows, unpack_rows

    if position_ids is not None:
        raise ValueError("packed scoring takes each row's positions from attention_mask (0 at its first "
                         "real token): pass position_ids=None, or packed=False")
    check_packable(model)
    rows = pack_rows(input_ids, attention_mask)
    if rows.num_tokens == 0:  # nothing real to pack: the padded body (no tokens to save either)
        return _last_hidden(body(input_ids=input_ids, attention_mask=attention_mask,
                                 position_ids=position_ids_from_mask(attention_mask), use_cache=False))
    out = body(input_ids=rows.input_ids, attention_mask=None, position_ids=rows.position_ids, use_cache=False)
    return unpack_rows(_last_hidden(out), rows.real)


def _scatter(values: list, sel: torch.Tensor, keep: bool) -> torch.Tensor:
    """[B, T] float32 with the gathered ``values`` (row-major over ``sel`` [B, T - 1]) at the
    positions 1.. where ``sel`` holds, 0 elsewhere (position 0 never has a left context)."""
    B = sel.shape[0]
    flat = _upcast(torch.cat(values)) if values else sel.new_zeros((0,), dtype=torch.float32)
    out = torch.zeros(sel.shape, dtype=flat.dtype, device=sel.device)
    if keep:
        out = out.masked_scatter(sel, flat)
    else:
        out = out + 0.0 * flat.sum()  # the weight-0 stand-in: keeps the graph, changes nothing
    return torch.cat([out.new_zeros((B, 1)), out], dim=1)


def _detached_entropy(head, hidden, mask: torch.Tensor, temperature: float, rows_per_chunk: int) -> torch.Tensor:
    """Entropy H_t = logsumexp(z) - sum softmax(z) * z (z = head(h_{t-1}) / T) at the positions
    of ``mask`` [B, T], no gradient (a metric), chunked like the log-probs; 0 elsewhere."""
    sel = mask[:, 1:]
    out = torch.zeros(sel.shape, dtype=torch.float32, device=hidden.device)
    with torch.no_grad():
        h = hidden.detach()[:, :-1][sel]
        vals = []
        for s in range(0, h.shape[0], rows_per_chunk):
            vals.append(_entropy_rows(head(h[s : s + rows_per_chunk]), temperature))
        if vals:
            out = out.to(vals[0].dtype).masked_scatter(sel, torch.cat(vals))
    return torch.cat([out.new_zeros((sel.shape[0], 1)), out], dim=1)


def naive_token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    return_entropy: bool = False,
    position_ids: torch.Tensor | None = None,
):
    """Reference implementation: full [B, T, V] float32 logits, same alignment and zeros."""
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if position_ids is None:
        position_ids = position_ids_from_mask(attention_mask)
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    ).logits
    logits = _upcast(logits)
    logp_all = F.log_softmax(logits[:, :-1] / temperature, dim=-1)
    lp = logp_all.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    B = input_ids.shape[0]
    zero = lp.new_zeros((B, 1))
    valid = _valid_targets(attention_mask)
    logp = torch.where(valid, torch.cat([zero, lp], 1), torch.zeros_like(valid, dtype=lp.dtype))
    if not return_entropy:
        return logp
    ent = -(logp_all.exp() * logp_all).sum(-1)
    ent = torch.where(valid, torch.cat([zero, ent], 1), torch.zeros_like(valid, dtype=lp.dtype))
    return logp, ent
