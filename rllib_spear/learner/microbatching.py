"""Token-budget micro-batching of a learner batch (rows of token columns, [B, T] or [B]).

Pure torch, no RLlib: the learner's update loop (``core``) and benchmarks/learner_throughput.py
split a batch the same way with these functions. :class:`LossMetrics` combines the loss metrics of
an update's micro-batches (and learners).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Mapping

import torch

from ..core.losses import METRIC_KIND

__all__ = ["token_budget_microbatches", "entropy_metric_sample", "slice_rows", "dummy_rows", "total_grad_norm",
           "EPOCH_COLUMNS", "num_epochs_of", "epoch_view", "LossMetrics"]

#: Columns with one entry per (row, epoch), [B, num_epochs] (``recipe.batching``).
EPOCH_COLUMNS = ("minibatch_id", "norm_num_tokens", "norm_num_seqs")


def num_epochs_of(data: dict) -> int:
    """The epochs of a learner batch: the width of its ``minibatch_id`` ([B] = one epoch)."""
    ids = data["minibatch_id"]
    return int(ids.shape[1]) if ids.dim() == 2 else 1


def epoch_view(data: dict, epoch: int) -> dict:
    """``data`` with the per-epoch columns (``EPOCH_COLUMNS``) of ``epoch``, [B]: what the
    micro-batch functions below slice (they take every 2-D column as [B, T])."""
    out = dict(data)
    for k in EPOCH_COLUMNS:
        if k in out and out[k].dim() == 2:
            out[k] = out[k][:, epoch]
    return out


def token_budget_microbatches(attention_mask: torch.Tensor, budget: int, *,
                              packed: bool = False) -> list[torch.Tensor]:
    """Rows grouped into parts with ``len(part) x longest row of the part <= budget`` (padded
    micro-batches), or ``sum of the part's real tokens <= budget`` with ``packed`` (the learner's
    ``packed_microbatches``: the body runs over the real tokens only, ``models.packing``, so a
    part is filled up to the budget whatever its lengths).

    Rows are taken longest first, so that each part holds rows of similar length: a padded part
    is padded to its longest row, and mixing a 400-token trajectory with 60-token guesses pays
    the padding on every short row (a third of the learner's FLOPs in the search task). The
    order of rows does not change the accumulated gradient (the loss uses global normalizers).
    A single row longer than the budget forms its own part (it cannot be split). Each part is a
    sorted LongTensor of row indices.
    """
    lengths = attention_mask.sum(dim=1).tolist()
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    parts: list[list[int]] = []
    cur: list[int] = []
    cur_max = cur_sum = 0
    for i in order:
        L = int(lengths[i])
        new_max = max(cur_max, L)
        cost = cur_sum + L if packed else new_max * (len(cur) + 1)
        if cur and cost > budget:
            parts.append(cur)
            cur, new_max, cur_sum = [], L, 0
        cur.append(i)
        cur_max, cur_sum = new_max, cur_sum + L
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


class LossMetrics:
    """The loss metrics of one update, combined over its micro-batches (and learners) so that
    they do not depend on the micro-batch split or the learner count (``METRIC_KIND``).

    With micro-batch calls c of mini-batch step s (``step``: (epoch, mini-batch)) and n_c loss
    tokens each:

    * share x:       ``x = mean_s sum_{c in s} x_c``  (the sum of a step's shares is its loss);
    * count x:       ``x = mean_epoch sum_{c in epoch} x_c``  (the batch's count);
    * token mean x:  ``x = sum_c n_c x_c / sum_c n_c``  (calls with n_c = 0 weigh nothing);
    * max / min x:   the extreme over the calls with n_c > 0.

    Every accumulator is a plain dict, so that the learners' states can be gathered and merged
    (:meth:`merged`).
    """

    #: share key of the learner's returned loss (the weighted sum of the parts); not a metric
    TOTAL = "__total_loss"

    def __init__(self) -> None:
        self.step: tuple[int, int] = (0, 0)  # (epoch, mini-batch) of the calls being added
        self.shares: dict[str, dict[tuple[int, int], float]] = defaultdict(lambda: defaultdict(float))
        self.counts: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        self.weighted: dict[str, list[float]] = {}  # key -> [sum n_c x_c, sum n_c]
        self.extremes: dict[str, tuple[str, float]] = {}  # key -> (kind, value)

    def add_share(self, key: str, value: float) -> None:
        self.shares[key][self.step] += float(value)

    def add_count(self, key: str, value: float) -> None:
        self.counts[key][self.step[0]] += float(value)

    def add_token_mean(self, key: str, value: float, weight: float) -> None:
        if weight > 0:
            acc = self.weighted.setdefault(key, [0.0, 0.0])
            acc[0] += float(value) * weight
            acc[1] += weight

    def add_extreme(self, key: str, value: float, kind: str) -> None:
        pick = max if kind == "max" else min
        old = self.extremes.get(key)
        self.extremes[key] = (kind, float(value) if old is None else pick(old[1], float(value)))

    def add(self, metrics: Mapping[str, float], prefix: str = "") -> None:
        """One ``policy_loss`` call's metrics (weight: its ``num_tokens``), keys prefixed."""
        n = float(metrics.get("num_tokens", 0.0))
        for k, v in metrics.items():
            kind = METRIC_KIND.get(k, "token_mean")
            if kind == "share":
                self.add_share(prefix + k, v)
            elif kind == "count":
                self.add_count(prefix + k, v)
            elif kind == "token_mean":
                self.add_token_mean(prefix + k, v, n)
            elif n > 0:  # a call without loss tokens reports 0 for its max / min
                self.add_extreme(prefix + k, v, kind)

    def state(self) -> dict:
        """Plain, picklable accumulators (what :meth:`merged` combines)."""
        return {"shares": {k: dict(v) for k, v in self.shares.items()},
                "counts": {k: dict(v) for k, v in self.counts.items()},
                "weighted": dict(self.weighted), "extremes": dict(self.extremes)}

    @classmethod
    def merged(cls, states: Iterable[dict]) -> "LossMetrics":
        """The metrics of several learners' updates of the same global batch: shares and counts
        add up per step / epoch, token means pool their tokens, extremes take the extreme."""
        out = cls()
        for st in states:
            for k, per_step in st["shares"].items():
                for step, v in per_step.items():
                    out.shares[k][step] += v
            for k, per_epoch in st["counts"].items():
                for epoch, v in per_epoch.items():
                    out.counts[k][epoch] += v
            for k, (num, den) in st["weighted"].items():
                acc = out.weighted.setdefault(k, [0.0, 0.0])
                acc[0] += num
                acc[1] += den
            for k, (kind, v) in st["extremes"].items():
                out.add_extreme(k, v, kind)
        return out

    def total_loss(self) -> float:
        """The update's loss: the mean over its optimizer steps of each step's summed shares."""
        per_step = self.shares.get(self.TOTAL) or {}
        return sum(per_step.values()) / len(per_step) if per_step else 0.0

    def results(self) -> dict[str, tuple[float, str]]:
        """``{key: (value, logger reduce)}`` of every metric (the returned loss left out)."""
        out: dict[str, tuple[float, str]] = {}
        for k, per_step in self.shares.items():
            if k != self.TOTAL:
                out[k] = (sum(per_step.values()) / len(per_step), "mean")
        for k, per_epoch in self.counts.items():
            out[k] = (sum(per_epoch.values()) / len(per_epoch), "mean")
        for k, (num, den) in self.weighted.items():
            out[k] = (num / den, "mean")
        for k, (kind, v) in self.extremes.items():
            out[k] = (v, kind)
        return out
