"""The token-level policy loss: the shared pieces around a registered mode's per-token term."""
from __future__ import annotations

import math

import torch

from .aggregation import LossNormalizer, aggregate_token_values, check_2d, check_counts
from .config import KL_ESTIMATORS, PolicyLossConfig
from .modes import PolicyTerms, get_policy_loss

__all__ = ["METRIC_KIND", "METRIC_REDUCE", "kl_penalty", "policy_loss"]

#: How each metric of :func:`policy_loss` combines over the micro-batches of an update (the
#: learner's ``LossMetrics``; a metric not listed is a "token_mean"):
#:
#: * "share": the call's share of the mini-batch value (the loss terms: each is divided by the
#:   *global* normalizer, so the shares of all micro-batches and learners add up to the
#:   mini-batch's loss); summed within a mini-batch, averaged over mini-batches;
#: * "count": summed over the batch (every row is in one micro-batch per epoch);
#: * "token_mean": a mean over the call's loss tokens; weighted by ``num_tokens``, so a call with
#:   no loss token (a fully masked micro-batch, a dummy row) weighs nothing;
#: * "max" / "min": the extreme over the update's loss tokens (calls without loss tokens skipped).
METRIC_KIND: dict[str, str] = {
    "loss": "share", "pg_loss": "share",
    "num_tokens": "count", "num_seqs": "count",
    "ratio_max": "max", "logp_mismatch_max": "max",
    "ratio_min": "min",
}

#: The logger's reduction of a metric over updates (default "mean"): a maximum must stay a
#: maximum, or it reads as an average of per-batch maxima.
METRIC_REDUCE: dict[str, str] = {k: v for k, v in METRIC_KIND.items() if v in ("max", "min")}

# |log-ratio| bound before exp (docs/algorithms.md 1.2): keeps rho finite so 0-weighted tokens never give NaN.
_LOG_RATIO_CLAMP = 20.0
# verl's low_var_kl clamps the k3 value to [-10, 10]; kept so a diverged token cannot dominate.
_K3_CLAMP = 10.0


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


def _masked_stats(values: torch.Tensor, valid: torch.Tensor) -> tuple[float, float, float]:
    """(mean, max, min) over valid positions; zeros when there are none."""
    if not bool(valid.any()):
        return 0.0, 0.0, 0.0
    sel = values[valid].detach().to(torch.float64)
    return float(sel.mean()), float(sel.max()), float(sel.min())


def _frac(flags: torch.Tensor | None, valid: torch.Tensor, n_valid: int) -> float:
    if flags is None:
        return 0.0
    return float((flags & valid).sum().item()) / n_valid if n_valid else 0.0


def _check_inputs(fn, logp_new, logp_old, advantages, mask, config, normalizer, engine_logp, ref_logp, entropy):
    if not isinstance(config, PolicyLossConfig):
        raise ValueError(f"{fn}: config must be a PolicyLossConfig, got {type(config).__name__}")
    config.validate(fn)
    if not isinstance(normalizer, LossNormalizer):
        raise ValueError(f"{fn}: normalizer must be a LossNormalizer, got {type(normalizer).__name__}")
    check_2d("logp_new", logp_new, fn)
    shape = logp_new.shape
    for name, t in (("logp_old", logp_old), ("advantages", advantages), ("mask", mask)):
        check_2d(name, t, fn, shape)
    for name, t in (("engine_logp", engine_logp), ("ref_logp", ref_logp), ("entropy", entropy)):
        if t is not None:
            check_2d(name, t, fn, shape)
    if config.kl_coef > 0 and ref_logp is None:
        raise ValueError(f"{fn}: ref_logp is required when config.kl_coef > 0 (got None)")
    if config.entropy_coef != 0 and entropy is None:
        raise ValueError(f"{fn}: entropy is required when config.entropy_coef != 0 (got None)")
    check_counts(mask, normalizer, fn)


def _policy_terms(logp_new, logp_old, advantages, mask, config, generator) -> tuple[PolicyTerms, torch.Tensor]:
    """The shared pieces (docs/algorithms.md 1.2) and the clamped log-ratio (for approx_kl)."""
    dtype = logp_new.dtype
    m = mask.to(dtype)
    valid = m > 0
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
    terms = PolicyTerms(
        logp=logp_new, old_logp=old, advantages=adv, mask=m, valid=valid, n_valid=int(valid.sum().item()),
        log_ratio=raw_log_ratio, ratio=ratio, loss_unclipped=loss1, loss_clipped=loss2,
        ppo_clipped=(loss2 > loss1) & valid, generator=generator,
    )
    return terms, log_ratio


def _importance_weight(tok, terms: PolicyTerms, engine_logp, config, metrics: dict) -> torch.Tensor:
    """Engine-vs-trainer mismatch metrics and the truncated IS weight (docs/algorithms.md 1.6)."""
    valid, old, n_valid = terms.valid, terms.old_logp, terms.n_valid
    eng = torch.where(valid, engine_logp.detach().to(terms.logp.dtype), old)
    diff = (eng - old).abs()
    mm_mean, mm_max, _ = _masked_stats(diff, valid)
    metrics["logp_mismatch_mean"] = mm_mean
    metrics["logp_mismatch_max"] = mm_max
    if config.tis_cap is None:
        return tok
    raw_w = torch.exp((old - eng).clamp(max=math.log(config.tis_cap) + 1.0))
    w = torch.where(valid, raw_w.clamp(max=config.tis_cap), torch.ones_like(raw_w)).detach()
    metrics["tis_weight_mean"] = _masked_stats(w, valid)[0]
    metrics["tis_clipfrac"] = _frac(raw_w >= config.tis_cap, valid, n_valid)
    return tok * w


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
    ``l1 = -A*rho``, ``l2 = -A*clip(rho, 1-eps_low, 1+eps_high)``. The per-token loss ``l`` is
    the registered mode ``config.loss_mode`` (``core.losses.modes``: ``vanilla`` PPO clip with
    optional dual clip, ``clip_cov``, ``kl_cov``, or one added with ``register_policy_loss``).

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
    _check_inputs(fn, logp_new, logp_old, advantages, mask, config, normalizer, engine_logp, ref_logp, entropy)
    terms, log_ratio = _policy_terms(logp_new, logp_old, advantages, mask, config, generator)
    out = get_policy_loss(config.loss_mode)(terms, config)
    tok = out.loss
    m, valid, n_valid = terms.mask, terms.valid, terms.n_valid

    metrics: dict[str, float] = {}
    if engine_logp is not None:
        tok = _importance_weight(tok, terms, engine_logp, config, metrics)

    mode = config.loss_agg_mode
    pg_loss = aggregate_token_values(tok, m, mode, normalizer)
    loss = pg_loss
    if ref_logp is not None:
        ref = torch.where(valid, ref_logp.detach().to(logp_new.dtype), logp_new.detach())
        kl = kl_penalty(logp_new, ref, config.kl_estimator)
        metrics["kl_ref"] = _masked_stats(kl, valid)[0]
        if config.kl_coef > 0:
            loss = loss + config.kl_coef * aggregate_token_values(kl, m, mode, normalizer)
    if entropy is not None:
        metrics["entropy"] = _masked_stats(entropy, valid)[0]
        if config.entropy_coef != 0:
            loss = loss - config.entropy_coef * aggregate_token_values(entropy, m, mode, normalizer)

    ratio = terms.ratio
    r_mean, r_max, r_min = _masked_stats(ratio, valid)
    approx_kl = ratio.detach() - 1.0 - log_ratio.detach()
    high = terms.advantages > 0
    clipped = out.clipped  # None: the mode applies no PPO clip (kl_cov), so nothing is clipped
    metrics.update(
        loss=float(loss.detach()),
        pg_loss=float(pg_loss.detach()),
        pg_clipfrac=_frac(clipped, valid, n_valid),
        pg_clipfrac_high=_frac(None if clipped is None else clipped & high, valid, n_valid),
        pg_clipfrac_low=_frac(None if clipped is None else clipped & ~high, valid, n_valid),
        pg_clipfrac_dual=_frac(out.dual_clipped, valid, n_valid),
        cov_fraction=_frac(out.cov_selected, valid, n_valid),
        ratio_mean=r_mean,
        ratio_max=r_max,
        ratio_min=r_min,
        approx_kl=_masked_stats(approx_kl, valid)[0],
        num_tokens=float(m.sum().item()),
        num_seqs=float(valid.any(dim=1).sum().item()),
    )
    return loss, metrics
