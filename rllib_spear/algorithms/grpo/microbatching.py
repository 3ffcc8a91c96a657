"""Token-budget micro-batching of a learner batch (rows of token columns, [B, T] or [B]).

Pure torch, no RLlib: the learner's update loop and benchmarks/learner_throughput.py split a
batch the same way with these functions.
"""
from __future__ import annotations

import torch

__all__ = ["token_budget_microbatches", "entropy_metric_sample", "slice_rows", "dummy_rows", "total_grad_norm"]


def token_budget_microbatches(attention_mask: torch.Tensor, budget: int) -> list[torch.Tensor]:
    """Rows packed into parts with ``len(part) x longest row of the part <= budget``.

    Rows are taken longest first, so that each part holds rows of similar length: a part is
    padded to its longest row, and mixing a 400-token trajectory with 60-token guesses pays
    the padding on every short row (a third of the learner's FLOPs in the search task). The
    order of rows does not change the accumulated gradient (the loss uses global normalizers).
    A single row longer than the budget forms its own part (it cannot be split). Each part is a
    sorted LongTensor of row indices.
    """
    lengths = attention_mask.sum(dim=1).tolist()
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    parts: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for i in order:
        L = int(lengths[i])
        new_max = max(cur_max, L)
        if cur and new_max * (len(cur) + 1) > budget:
            parts.append(cur)
            cur, new_max = [], L
        cur.append(i)
        cur_max = new_max
    if cur:
        parts.append(cur)
    return [torch.tensor(sorted(p), dtype=torch.long) for p in parts]


def entropy_metric_sample(loss_mask: torch.Tensor, max_tokens: int, generator: torch.Generator) -> torch.Tensor:
    """[B, T] bool: ``min(max_tokens, n)`` of the ``n`` loss tokens (``loss_mask > 0``), drawn
    uniformly without replacement, where the entropy metric is computed.

    Every loss token is in the sample with the same probability k / n, so the sample mean
    (1/k) sum_{t in S} H_t is an unbiased estimate of the token mean (1/n) sum_t H_t, on any
    batch size and any micro-batch split, at a cost bounded by k head rows (forward only). The
    tokens of one part (on-policy or replayed rows) in the sample are, given their count, a
    uniform sample of that part: its sample mean is unbiased for the part's token mean too.
    """
    if max_tokens < 0:
        raise ValueError(f"entropy_metric_tokens must be >= 0 (0 = no entropy metric), got {max_tokens}")
    flat = (loss_mask > 0).flatten()
    idx = torch.nonzero(flat).flatten()
    if len(idx) > max_tokens:
        idx = idx[torch.randperm(len(idx), generator=generator)[:max_tokens]]
    out = torch.zeros_like(flat)
    out[idx] = True
    return out.view(loss_mask.shape)


def slice_rows(data: dict, rows: torch.Tensor) -> dict:
    """The tensor columns of ``data`` at ``rows``, the time axis trimmed to the longest real row
    (``attention_mask``); non-tensor entries are dropped."""
    T = int(data["attention_mask"][rows].sum(dim=1).max().item()) if len(rows) else 1
    out = {}
    for k, v in data.items():
        if not isinstance(v, torch.Tensor):
            continue
        v = v[rows]
        out[k] = v[:, :T] if v.dim() == 2 else v
    return out


def dummy_rows(data: dict) -> dict:
    """A one-row, fully masked batch (loss 0) so that DDP / FSDP ranks without rows stay in
    lockstep with the others (same number of forwards and backwards)."""
    out = slice_rows(data, torch.tensor([0]))
    out["loss_mask"] = torch.zeros_like(out["loss_mask"])
    if "entropy_metric_mask" in out:
        out["entropy_metric_mask"] = torch.zeros_like(out["entropy_metric_mask"])
    out["norm_num_tokens"] = torch.ones_like(out["norm_num_tokens"])
    out["norm_num_seqs"] = torch.ones_like(out["norm_num_seqs"])
    return out


def total_grad_norm(grads) -> float:
    """L2 norm over all gradients (whole tensors; FSDP shards: ``models.sharding.global_grad_norm``)
    with a single host sync (not one per tensor)."""
    gs = [g.detach() for g in grads]
    if not gs:
        return 0.0
    return float(torch.nn.utils.get_total_norm(gs, norm_type=2.0))
