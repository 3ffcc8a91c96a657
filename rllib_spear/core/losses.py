"""Token-level policy losses: PPO clip with clip-higher and dual clip (docs/algorithms.md 1.2), global loss
aggregation (1.3), Clip-Cov / KL-Cov entropy control (1.4), truncated importance sampling for
engine/trainer mismatch (1.6), optional KL to a reference policy and entropy bonus.

Pure torch. Every per-token tensor is [B, T] and aligned token by token (see
``core.trajectory``). Aggregation uses *global* normalizers (:class:`LossNormalizer`) computed
once over the whole batch, so that summing the losses of any row-wise split into micro-batches or
learners gives the whole-batch loss and gradient.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace

import torch

__all__ = [
    "LOSS_MODES",
    "AGG_MODES",
    "KL_ESTIMATORS",
    "PolicyLossConfig",
    "METRIC_REDUCE",
    "LossNormalizer",
    "loss_normalizer",
    "aggregate_token_values",
    "masked_mean",
    "kl_penalty",
    "policy_loss",
]

LOSS_MODES = ("vanilla", "clip_cov", "kl_cov")
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k3")

#: How a metric of :func:`policy_loss` combines over micro-batches and updates (default "mean").
#: A maximum must stay a maximum: logged with a mean it reads as an average of per-batch maxima.
METRIC_REDUCE: dict[str, str] = {"logp_mismatch_max": "max"}

# |log-ratio| bound before exp (docs/algorithms.md 1.2): keeps rho finite so 0-weighted tokens never give NaN.
_LOG_RATIO_CLAMP = 20.0
# verl's low_var_kl clamps the k3 value to [-10, 10]; kept so a diverged token cannot dominate.
_K3_CLAMP = 10.0


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------
@dataclass
class PolicyLossConfig:
    """Hyper-parameters of :func:`policy_loss`.

    Attributes:
        clip_ratio_low / clip_ratio_high: PPO clip range ``[1 - eps_low, 1 + eps_high]``
            (GRPO 0.2/0.2; Dr.BoT/SPEAR 0.2/0.28 "clip-higher").
        dual_clip_c: dual-clip bound c (> 1) for A < 0, ``l = min(l, -A*c)``; None = off.
            Only applied in ``vanilla`` mode, as released (clip_cov and kl_cov have no dual clip).
        loss_mode: "vanilla" | "clip_cov" | "kl_cov".
        loss_agg_mode: one of :data:`AGG_MODES` (docs/algorithms.md 1.3).
        clip_cov_ratio / clip_cov_lb / clip_cov_ub: Clip-Cov r, lb, ub (on-policy 2e-4/1/5; SPEAR
            agent replay 0.02/2/60).
        kl_cov_ratio / kl_cov_coef: KL-Cov r and coefficient of ``|logp_new - logp_old|``.
        tis_cap: truncation C of the engine-mismatch importance weight (docs/algorithms.md 1.6 uses C=2);
            None = no weight (mismatch is still reported when engine log-probs are given).
        kl_coef / kl_estimator: KL-to-reference term added to the loss ("k1" or "k3"); 0 = off.
        entropy_coef: entropy bonus, ``loss -= entropy_coef * aggregate(entropy)``.
    """

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    dual_clip_c: float | None = None
    loss_mode: str = "vanilla"
    loss_agg_mode: str = "token-mean"
    clip_cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 2e-4
    kl_cov_coef: float = 0.1
    tis_cap: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0

    def validate(self, where: str = "PolicyLossConfig", names: dict[str, str] | None = None) -> "PolicyLossConfig":
        """Raise ValueError naming the offending field; return self.

        ``names`` maps a field to the name the user set it by (an algorithm config's
        ``training()`` kwarg, e.g. ``{"kl_coef": "kl_coeff"}``), so the message names that."""
        names = names or {}

        def bad(field: str, need: str) -> ValueError:
            return ValueError(f"{where}: `{names.get(field, field)}` must be {need}, got {getattr(self, field)!r}")

        def finite(field: str) -> float:
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise bad(field, "a finite number")
            return float(v)

        if finite("clip_ratio_low") < 0:
            raise bad("clip_ratio_low", ">= 0")
        if self.clip_ratio_low >= 1:
            raise bad("clip_ratio_low", "< 1 (the ratio's lower bound 1 - clip_ratio_low must be > 0)")
        if finite("clip_ratio_high") < 0:
            raise bad("clip_ratio_high", ">= 0")
        if self.dual_clip_c is not None and finite("dual_clip_c") <= 1.0:
            raise bad("dual_clip_c", "> 1 (or None)")
        if self.loss_mode not in LOSS_MODES:
            raise bad("loss_mode", f"one of {LOSS_MODES}")
        if self.loss_agg_mode not in AGG_MODES:
            raise bad("loss_agg_mode", f"one of {AGG_MODES}")
        if not 0 < finite("clip_cov_ratio") <= 1:
            raise bad("clip_cov_ratio", "in (0, 1]")
        finite("clip_cov_lb")
        if finite("clip_cov_ub") <= self.clip_cov_lb:
            raise bad("clip_cov_ub", f"> clip_cov_lb ({self.clip_cov_lb})")
        if not 0 < finite("kl_cov_ratio") <= 1:
            raise bad("kl_cov_ratio", "in (0, 1]")
        if finite("kl_cov_coef") < 0:
            raise bad("kl_cov_coef", ">= 0")
        if self.tis_cap is not None and finite("tis_cap") <= 0:
            raise bad("tis_cap", "> 0 (or None)")
        if finite("kl_coef") < 0:
            raise bad("kl_coef", ">= 0")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise bad("kl_estimator", f"one of {KL_ESTIMATORS}")
        finite("entropy_coef")
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    def replace(self, **changes) -> "PolicyLossConfig":
        return replace(self, **changes).validate()


# ---------------------------------------------------------------------------------------------
# Global normalizers and aggregation
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


def _check_2d(name: str, t: torch.Tensor, fn: str, shape: torch.Size | None = None) -> None:
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
    _check_2d("loss_mask", loss_mask, "loss_normalizer")
    if not (isinstance(t_norm, (int, float)) and not isinstance(t_norm, bool)) or not t_norm > 0:
        raise ValueError(f"loss_normalizer: t_norm must be > 0, got {t_norm!r}")
    m = loss_mask.detach().to(torch.float64)
    if m.numel() and (m.min().item() < 0):
        raise ValueError("loss_normalizer: loss_mask must be >= 0")
    return LossNormalizer(float(m.sum().item()), float((m > 0).any(dim=1).sum().item()), float(t_norm))


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``sum(m * v) / sum(m)`` over the tensor (0 if the mask is empty); masked-out values may be
    non-finite without affecting the result."""
    m = mask.to(values.dtype)
    v = torch.where(m != 0, values, torch.zeros_like(values)) * m
    total = m.sum()
    return v.sum() / total if float(total.item()) > 0 else v.sum() * 0.0


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

    Every formula is a sum over rows divided by a global constant, so the results of a row-wise
    split add up to the whole-batch result. Fully masked rows contribute nothing. When the global
    denominator is 0 (everything masked) the result is a zero that still has a graph.
    """
    fn = "aggregate_token_values"
    if mode not in AGG_MODES:
        raise ValueError(f"{fn}: mode must be one of {AGG_MODES}, got {mode!r}")
    if not isinstance(normalizer, LossNormalizer):
        raise ValueError(f"{fn}: normalizer must be a LossNormalizer, got {type(normalizer).__name__}")
    _check_2d("values", values, fn)
    _check_2d("mask", mask, fn, values.shape)
    m = mask.to(values.dtype)
    # where() first so that garbage (inf/NaN) under mask 0 cannot leak as 0*inf = NaN.
    weighted = torch.where(m != 0, values, torch.zeros_like(values)) * m
    row_sum = weighted.sum(dim=-1)
    if mode == "token-mean":
        numer, denom = row_sum.sum(), normalizer.num_tokens
    else:
        if mode == "seq-mean-token-mean":
            n_i = m.sum(dim=-1)
            numer = torch.where(n_i > 0, row_sum / n_i.clamp_min(1e-12), torch.zeros_like(row_sum)).sum()
        else:
            numer = row_sum.sum()
        denom = normalizer.num_seqs * (normalizer.t_norm if mode == "seq-mean-token-sum-norm" else 1.0)
    if denom <= 0:
        return numer * 0.0
    return numer / denom


def _check_counts(mask: torch.Tensor, normalizer: LossNormalizer, fn: str) -> None:
    # A micro-batch can never hold more tokens/sequences than the global batch; catching this
    # finds the classic bug of passing a per-micro-batch normalizer built for a different batch.
    m = mask.detach().to(torch.float64)
    local_tok = float(m.sum().item())
    local_seq = float((m > 0).any(dim=1).sum().item())
    if local_tok > normalizer.num_tokens * (1 + 1e-9) + 1e-6 or local_seq > normalizer.num_seqs + 1e-6:
        raise ValueError(
            f"{fn}: normalizer counts ({normalizer.num_tokens:g} tokens, {normalizer.num_seqs:g} seqs) "
            f"are smaller than this call's mask ({local_tok:g} tokens, {local_seq:g} seqs); build the "
            "normalizer over the whole global batch"
        )


# ---------------------------------------------------------------------------------------------
# KL estimators
# ---------------------------------------------------------------------------------------------
def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate from samples of pi.

    - ``k1``: ``logp - ref_logp``
    - ``k3`` (low-variance): with ``d = clamp(ref_logp - logp, -20, 20)``,
      ``clamp(exp(d) - d - 1, -10, 10)`` (the clamps are verl's ``low_var_kl`` safety bounds; they
      only bind for diverged tokens).
    """
    if estimator == "k1":
        return logp - ref_logp
    if estimator == "k3":
        d = (ref_logp - logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        return (torch.exp(d) - d - 1.0).clamp(-_K3_CLAMP, _K3_CLAMP)
    raise ValueError(f"kl_penalty: estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")


# ---------------------------------------------------------------------------------------------
# Policy loss
# ---------------------------------------------------------------------------------------------
def _masked_stats(values: torch.Tensor, valid: torch.Tensor) -> tuple[float, float, float]:
    """(mean, max, min) over valid positions; zeros when there are none."""
    if not bool(valid.any()):
        return 0.0, 0.0, 0.0
    sel = values[valid].detach().to(torch.float64)
    return float(sel.mean()), float(sel.max()), float(sel.min())


def _frac(flags: torch.Tensor, valid: torch.Tensor, n_valid: int) -> float:
    return float((flags & valid).sum().item()) / n_valid if n_valid else 0.0


def policy_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    config: PolicyLossConfig,
    normalizer: LossNormalizer,
    engine_logp: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy-gradient loss of one micro-batch (all inputs [B, T], aligned token by token).

    Ratio (docs/algorithms.md 1.2): ``rho = exp(clamp(logp_new - logp_old, -20, 20))``;
    ``l1 = -A*rho``, ``l2 = -A*clip(rho, 1-eps_low, 1+eps_high)``.

    - ``vanilla``: ``l = max(l1, l2)``; with ``dual_clip_c = c`` and A < 0, ``l = min(l, -A*c)``.
    - ``clip_cov`` (docs/algorithms.md 1.4): ``l = max(l1, l2) * corr``. With
      ``cov = (A - mean_v A) * (logp_new - mean_v logp_new)`` over the valid (m>0) tokens of this
      call, candidates are valid tokens not PPO-clipped (``l2 > l1`` false) with
      ``lb < cov < ub``; ``min(k, #candidates)`` of them, ``k = max(floor(r * sum(m)), 1)``, chosen
      uniformly at random with ``generator``, get ``corr = 0`` (value and gradient 0; they stay in
      the denominators). No dual clip, as released.
    - ``kl_cov``: the top ``k = max(1, floor(r * N_valid))`` valid tokens by cov (ties: lower flat
      index first) get ``l = l1 + kl_cov_coef * |logp_new - logp_old|``; all others ``l = l1``.

    Truncated IS (docs/algorithms.md 1.6): when ``engine_logp`` is given and ``tis_cap = C`` is set, every token
    loss is multiplied by ``w = min(exp(logp_old - engine_logp), C)`` (detached).

    ``loss = agg(l) + kl_coef * agg(kl(logp_new, ref_logp)) - entropy_coef * agg(entropy)``, each
    ``agg`` = :func:`aggregate_token_values` with ``config.loss_agg_mode`` and the global
    ``normalizer``. Only ``logp_new`` (and ``entropy``) carry gradient; the rest is detached.

    Metrics (plain floats over the mask>0 tokens of this call): loss, pg_loss, pg_clipfrac,
    pg_clipfrac_high, pg_clipfrac_low, pg_clipfrac_dual, cov_fraction, ratio_mean/max/min,
    approx_kl (k3 estimate of KL(old || new): ``rho - 1 - log rho``), num_tokens, num_seqs, and
    when given: entropy, kl_ref, logp_mismatch_mean/max (``|engine_logp - logp_old|``),
    tis_weight_mean and tis_clipfrac (when the weight is applied).
    """
    fn = "policy_loss"
    if not isinstance(config, PolicyLossConfig):
        raise ValueError(f"{fn}: config must be a PolicyLossConfig, got {type(config).__name__}")
    config.validate(fn)
    if not isinstance(normalizer, LossNormalizer):
        raise ValueError(f"{fn}: normalizer must be a LossNormalizer, got {type(normalizer).__name__}")
    _check_2d("logp_new", logp_new, fn)
    shape = logp_new.shape
    for name, t in (("logp_old", logp_old), ("advantages", advantages), ("mask", mask)):
        _check_2d(name, t, fn, shape)
    for name, t in (("engine_logp", engine_logp), ("ref_logp", ref_logp), ("entropy", entropy)):
        if t is not None:
            _check_2d(name, t, fn, shape)
    if config.kl_coef > 0 and ref_logp is None:
        raise ValueError(f"{fn}: ref_logp is required when config.kl_coef > 0 (got None)")
    if config.entropy_coef != 0 and entropy is None:
        raise ValueError(f"{fn}: entropy is required when config.entropy_coef != 0 (got None)")
    _check_counts(mask, normalizer, fn)

    dtype = logp_new.dtype
    m = mask.to(dtype)
    valid = m > 0
    n_valid = int(valid.sum().item())
    # Neutralise whatever sits under mask 0 (padding may hold -inf/NaN log-probs): a NaN there
    # would survive as 0 * NaN = NaN in the gradient even though the value is masked out.
    lp_det = logp_new.detach()
    old = torch.where(valid, logp_old.detach().to(dtype), lp_det)
    adv = torch.where(valid, advantages.detach().to(dtype), torch.zeros_like(lp_det))

    raw_log_ratio = logp_new - old
    log_ratio = raw_log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    loss1 = -adv * ratio
    loss2 = -adv * ratio.clamp(1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high)
    ppo_clipped = (loss2 > loss1) & valid
    dual_active = torch.zeros_like(valid)
    affected = torch.zeros_like(valid)

    if config.loss_mode == "vanilla":
        tok = torch.maximum(loss1, loss2)
        if config.dual_clip_c is not None:
            loss3 = -adv * config.dual_clip_c
            neg = adv < 0
            dual_active = neg & (tok > loss3) & valid
            tok = torch.where(neg, torch.minimum(tok, loss3), tok)
    elif config.loss_mode == "clip_cov":
        tok = torch.maximum(loss1, loss2)
        cov = _token_cov(adv, logp_new.detach(), valid)
        cand = valid & ~ppo_clipped & (cov > config.clip_cov_lb) & (cov < config.clip_cov_ub)
        cand_idx = torch.nonzero(cand)  # row-major order, like the released code
        k = max(int(config.clip_cov_ratio * float(m.sum().item())), 1)
        if cand_idx.shape[0] > 0:
            gdev = generator.device if generator is not None else cand_idx.device
            perm = torch.randperm(cand_idx.shape[0], generator=generator, device=gdev)
            chosen = cand_idx[perm[: min(k, cand_idx.shape[0])].to(cand_idx.device)]
            affected[chosen[:, 0], chosen[:, 1]] = True
        # Multiply by 0 (not drop): value and gradient vanish, denominators are unchanged.
        tok = tok * (~affected).to(dtype)
    else:  # kl_cov
        tok = loss1
        if n_valid > 0:
            cov = _token_cov(adv, logp_new.detach(), valid)
            flat_valid = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
            cov_valid = cov.reshape(-1)[flat_valid]
            k = max(1, int(n_valid * config.kl_cov_ratio))
            # Stable descending sort: ties go to the lower flat index (torch.topk is unspecified).
            order = torch.sort(cov_valid, descending=True, stable=True).indices[:k]
            affected.view(-1)[flat_valid[order]] = True
            tok = torch.where(affected, loss1 + config.kl_cov_coef * raw_log_ratio.abs(), loss1)

    metrics: dict[str, float] = {}
    if engine_logp is not None:
        eng = torch.where(valid, engine_logp.detach().to(dtype), old)
        diff = (eng - old).abs()
        mm_mean, mm_max, _ = _masked_stats(diff, valid)
        metrics["logp_mismatch_mean"] = mm_mean
        metrics["logp_mismatch_max"] = mm_max
        if config.tis_cap is not None:
            raw_w = torch.exp((old - eng).clamp(max=math.log(config.tis_cap) + 1.0))
            w = torch.where(valid, raw_w.clamp(max=config.tis_cap), torch.ones_like(raw_w)).detach()
            tok = tok * w
            metrics["tis_weight_mean"] = _masked_stats(w, valid)[0]
            metrics["tis_clipfrac"] = _frac(raw_w >= config.tis_cap, valid, n_valid)

    mode = config.loss_agg_mode
    pg_loss = aggregate_token_values(tok, m, mode, normalizer)
    loss = pg_loss
    if ref_logp is not None:
        ref = torch.where(valid, ref_logp.detach().to(dtype), lp_det)
        kl = kl_penalty(logp_new, ref, config.kl_estimator)
        metrics["kl_ref"] = _masked_stats(kl, valid)[0]
        if config.kl_coef > 0:
            loss = loss + config.kl_coef * aggregate_token_values(kl, m, mode, normalizer)
    if entropy is not None:
        metrics["entropy"] = _masked_stats(entropy, valid)[0]
        if config.entropy_coef != 0:
            loss = loss - config.entropy_coef * aggregate_token_values(entropy, m, mode, normalizer)

    r_mean, r_max, r_min = _masked_stats(ratio, valid)
    approx_kl = ratio.detach() - 1.0 - log_ratio.detach()
    high = adv > 0
    metrics.update(
        loss=float(loss.detach()),
        pg_loss=float(pg_loss.detach()),
        # kl_cov applies no PPO clip, so nothing is clipped there.
        pg_clipfrac=0.0 if config.loss_mode == "kl_cov" else _frac(ppo_clipped, valid, n_valid),
        pg_clipfrac_high=0.0 if config.loss_mode == "kl_cov" else _frac(ppo_clipped & high, valid, n_valid),
        pg_clipfrac_low=0.0 if config.loss_mode == "kl_cov" else _frac(ppo_clipped & ~high, valid, n_valid),
        pg_clipfrac_dual=_frac(dual_active, valid, n_valid),
        cov_fraction=_frac(affected, valid, n_valid),
        ratio_mean=r_mean,
        ratio_max=r_max,
        ratio_min=r_min,
        approx_kl=_masked_stats(approx_kl, valid)[0],
        num_tokens=float(m.sum().item()),
        num_seqs=float(valid.any(dim=1).sum().item()),
    )
    return loss, metrics


def _token_cov(adv: torch.Tensor, logp: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``(A - mean_v A) * (logp - mean_v logp)`` with means over valid tokens; -inf elsewhere."""
    n = valid.sum()
    if int(n.item()) == 0:
        return torch.full_like(adv, -math.inf)
    a_mean = torch.where(valid, adv, torch.zeros_like(adv)).sum() / n
    l_mean = torch.where(valid, logp, torch.zeros_like(logp)).sum() / n
    cov = (adv - a_mean) * (logp - l_mean)
    return torch.where(valid, cov, torch.full_like(cov, -math.inf))
