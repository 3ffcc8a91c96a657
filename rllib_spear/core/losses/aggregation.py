"""Global loss normalizers and the registry of aggregation modes (docs/algorithms.md 1.3).

Every aggregation mode turns per-token values into a scalar as *a sum over rows divided by a
global constant* (:class:`LossNormalizer`, counted once over the whole batch), so that summing
the results of any row-wise split into micro-batches or learners gives the whole-batch result.
A mode registered with :func:`register_loss_agg` gets the masked row sums and returns that
numerator and denominator; the masking, the checks and the empty-batch case stay shared.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from ...registry import Registry

__all__ = [
    "AGG_MODES",
    "LOSS_AGGS",
    "LossAggFn",
    "register_loss_agg",
    "get_loss_agg",
    "LossNormalizer",
    "loss_normalizer",
    "aggregate_token_values",
    "masked_mean",
]

#: ``fn(row_sum, mask, normalizer) -> (numerator, denominator)``: ``row_sum`` [B] is
#: ``sum_t m_it v_it`` (garbage under mask 0 already removed), ``mask`` [B, T] the mask in the
#: values' dtype. The numerator must be a sum over rows and the denominator a float from the
#: global ``normalizer`` only, so that row-wise splits add up.
LossAggFn = Callable[[torch.Tensor, torch.Tensor, "LossNormalizer"], "tuple[torch.Tensor, float]"]

#: Aggregation modes by name (``PolicyLossConfig.loss_agg_mode``).
LOSS_AGGS: Registry[LossAggFn] = Registry(
    "loss aggregation mode", register_hint="rllib_spear.core.losses.register_loss_agg")


def register_loss_agg(name: str, fn: LossAggFn | None = None, *, override: bool = False):
    """Register an aggregation mode under ``name`` (decorator when ``fn`` is omitted).

    ``fn(row_sum, mask, normalizer)`` returns ``(numerator, denominator)``; see :data:`LossAggFn`.
    Select it with ``PolicyLossConfig(loss_agg_mode=name)``.
    """
    return LOSS_AGGS.register(name, fn, override=override)


def get_loss_agg(name: str) -> LossAggFn:
    """The aggregation mode registered as ``name`` (ValueError listing the registered modes otherwise)."""
    return LOSS_AGGS.get(name)


# ---------------------------------------------------------------------------------------------
# Global normalizers
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LossNormalizer:
    """Global denominators of the aggregation modes.

    ``num_tokens`` = sum of the loss mask over the whole (global) batch; ``num_seqs`` = number of
    sequences with at least one mask-1 token; ``t_norm`` = the constant T_norm of
    ``seq-mean-token-sum-norm`` (the configured max response length). Counts from several
    learners are combined with ``+`` / :meth:`merge` (sum of counts; t_norm must agree).
    """

    num_tokens: float
    num_seqs: float
    t_norm: float

    def __post_init__(self) -> None:
        for name in ("num_tokens", "num_seqs"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"LossNormalizer: {name} must be finite and >= 0, got {v!r}")
        if not math.isfinite(self.t_norm) or self.t_norm <= 0:
            raise ValueError(f"LossNormalizer: t_norm must be > 0, got {self.t_norm!r}")

    def __add__(self, other: "LossNormalizer") -> "LossNormalizer":
        if not isinstance(other, LossNormalizer):
            return NotImplemented
        if other.t_norm != self.t_norm:
            raise ValueError(
                f"LossNormalizer: cannot merge t_norm {self.t_norm} with t_norm {other.t_norm}"
            )
        return LossNormalizer(self.num_tokens + other.num_tokens,
                              self.num_seqs + other.num_seqs, self.t_norm)

    @staticmethod
    def merge(normalizers: Iterable["LossNormalizer"]) -> "LossNormalizer":
        """Sum the counts of per-shard normalizers (e.g. gathered from every learner)."""
        items = list(normalizers)
        if not items:
            raise ValueError("LossNormalizer.merge: normalizers is empty")
        out = items[0]
        for n in items[1:]:
            out = out + n
        return out

    def as_tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[num_tokens, num_seqs]`` as float64, ready for an all-reduce(SUM)."""
        return torch.tensor([self.num_tokens, self.num_seqs], dtype=torch.float64, device=device)

    @classmethod
    def from_tensor(cls, counts: torch.Tensor, t_norm: float) -> "LossNormalizer":
        if counts.numel() != 2:
            raise ValueError(f"LossNormalizer.from_tensor: counts must have 2 entries, got {counts.numel()}")
        c = counts.detach().double().cpu().tolist()
        return cls(float(c[0]), float(c[1]), float(t_norm))


def check_2d(name: str, t: torch.Tensor, fn: str, shape: torch.Size | None = None) -> None:
    """Raise ValueError (naming ``fn`` and ``name``) unless ``t`` is a 2-D tensor of ``shape``."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{fn}: {name} must be 2-D [B, T], got shape {tuple(t.shape)}")
    if shape is not None and t.shape != shape:
        raise ValueError(
            f"{fn}: {name} has shape {tuple(t.shape)}, expected {tuple(shape)} (same as logp_new)"
        )


def loss_normalizer(loss_mask: torch.Tensor, t_norm: float) -> LossNormalizer:
    """Normalizer of a batch: ``num_tokens = sum(m)``, ``num_seqs = #{i : sum_t m_it > 0}``.

    Call it on the loss mask of the WHOLE global batch (or per shard and merge).
    """
    check_2d("loss_mask", loss_mask, "loss_normalizer")
    if not (isinstance(t_norm, (int, float)) and not isinstance(t_norm, bool)) or not t_norm > 0:
        raise ValueError(f"loss_normalizer: t_norm must be > 0, got {t_norm!r}")
    m = loss_mask.detach().to(torch.float64)
    if m.numel() and (m.min().item() < 0):
        raise ValueError("loss_normalizer: loss_mask must be >= 0")
    return LossNormalizer(float(m.sum().item()), float((m > 0).any(dim=1).sum().item()), float(t_norm))


def check_counts(mask: torch.Tensor, normalizer: LossNormalizer, fn: str) -> None:
    """Raise ValueError if ``mask`` holds more tokens or sequences than ``normalizer`` counts.

    A micro-batch can never hold more than the global batch; this catches the classic bug of
    passing a per-micro-batch normalizer built for a different batch."""
    m = mask.detach().to(torch.float64)
    local_tok = float(m.sum().item())
    local_seq = float((m > 0).any(dim=1).sum().item())
    if local_tok > normalizer.num_tokens * (1 + 1e-9) + 1e-6 or local_seq > normalizer.num_seqs + 1e-6:
        raise ValueError(
            f"{fn}: normalizer counts ({normalizer.num_tokens:g} tokens, {normalizer.num_seqs:g} seqs) "
            f"are smaller than this call's mask ({local_tok:g} tokens, {local_seq:g} seqs); build the "
            "normalizer over the whole global batch"
        )


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``sum(m * v) / sum(m)`` over the tensor (0 if the mask is empty); masked-out values may be
    non-finite without affecting the result."""
    m = mask.to(values.dtype)
    v = torch.where(m != 0, values, torch.zeros_like(values)) * m
    total = m.sum()
    return v.sum() / total if float(total.item()) > 0 else v.sum() * 0.0


# ---------------------------------------------------------------------------------------------
# Aggregation modes
# ---------------------------------------------------------------------------------------------
@register_loss_agg("token-mean")
def _token_mean(row_sum: torch.Tensor, mask: torch.Tensor, norm: LossNormalizer):
    return row_sum.sum(), norm.num_tokens


@register_loss_agg("seq-mean-token-mean")
def _seq_mean_token_mean(row_sum: torch.Tensor, mask: torch.Tensor, norm: LossNormalizer):
    n_i = mask.sum(dim=-1)
    return torch.where(n_i > 0, row_sum / n_i.clamp_min(1e-12), torch.zeros_like(row_sum)).sum(), norm.num_seqs


@register_loss_agg("seq-mean-token-sum")
def _seq_mean_token_sum(row_sum: torch.Tensor, mask: torch.Tensor, norm: LossNormalizer):
    return row_sum.sum(), norm.num_seqs


@register_loss_agg("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(row_sum: torch.Tensor, mask: torch.Tensor, norm: LossNormalizer):
    return row_sum.sum(), norm.num_seqs * norm.t_norm


#: The built-in aggregation modes (``LOSS_AGGS.names()`` also lists registered ones).
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def aggregate_token_values(
    values: torch.Tensor, mask: torch.Tensor, mode: str, normalizer: LossNormalizer
) -> torch.Tensor:
    """Aggregate per-token values into a scalar with global denominators (docs/algorithms.md 1.3).

    With ``m`` the mask, ``S_i = sum_t m_it v_it``, ``n_i = sum_t m_it``, and the global counts
    ``N_tok = normalizer.num_tokens``, ``N_seq = normalizer.num_seqs``, ``T = normalizer.t_norm``:

    - ``token-mean``:              ``sum_i S_i / N_tok``
    - ``seq-mean-token-mean``:     ``sum_{i: n_i>0} (S_i / n_i) / N_seq``
    - ``seq-mean-token-sum``:      ``sum_i S_i / N_seq``
    - ``seq-mean-token-sum-norm``: ``sum_i S_i / (T * N_seq)``  (Dr.GRPO paper form)

    or any mode registered with :func:`register_loss_agg`. Every formula is a sum over rows
    divided by a global constant, so the results of a row-wise split add up to the whole-batch
    result. Fully masked rows contribute nothing. When the global denominator is 0 (everything
    masked) the result is a zero that still has a graph.
    """
    fn = "aggregate_token_values"
    if mode not in LOSS_AGGS:
        raise ValueError(f"{fn}: mode must be one of {LOSS_AGGS.names()}, got {mode!r}")
    if not isinstance(normalizer, LossNormalizer):
        raise ValueError(f"{fn}: normalizer must be a LossNormalizer, got {type(normalizer).__name__}")
    check_2d("values", values, fn)
    check_2d("mask", mask, fn, values.shape)
    m = mask.to(values.dtype)
    # where() first so that garbage (inf/NaN) under mask 0 cannot leak as 0*inf = NaN.
    weighted = torch.where(m != 0, values, torch.zeros_like(values)) * m
    numer, denom = get_loss_agg(mode)(weighted.sum(dim=-1), m, normalizer)
    if denom <= 0:
        return numer * 0.0
    return numer / denom
