"""Hyper-parameters of :func:`~rllib_spear.core.losses.policy_loss` (:class:`PolicyLossConfig`)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from .aggregation import LOSS_AGGS
from .modes import POLICY_LOSSES

__all__ = ["KL_ESTIMATORS", "PolicyLossConfig"]

KL_ESTIMATORS = ("k1", "k3")


@dataclass
class PolicyLossConfig:
    """Hyper-parameters of :func:`policy_loss`.

    Attributes:
        clip_ratio_low / clip_ratio_high: PPO clip range ``[1 - eps_low, 1 + eps_high]``
            (GRPO 0.2/0.2; Dr.BoT/SPEAR 0.2/0.28 "clip-higher").
        dual_clip_c: dual-clip bound c (> 1) for A < 0, ``l = min(l, -A*c)``; None = off.
            Only applied in ``vanilla`` mode, as released (clip_cov and kl_cov have no dual clip).
        loss_mode: a registered policy-loss mode (``POLICY_LOSSES``): built-in "vanilla" |
            "clip_cov" | "kl_cov", or one added with ``register_policy_loss``.
        loss_agg_mode: a registered aggregation mode (``LOSS_AGGS``): built-in :data:`AGG_MODES`
            (docs/algorithms.md 1.3), or one added with ``register_loss_agg``.
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

        ``loss_mode`` and ``loss_agg_mode`` must be registered names (the message lists the
        registered choices). ``names`` maps a field to the name the user set it by (an
        algorithm config's ``training()`` kwarg, e.g. ``{"kl_coef": "kl_coeff"}``), so the
        message names that."""
        names = names or {}

        def bad(field: str, need: str) -> ValueError:
            return ValueError(f"{where}: `{names.get(field, field)}` must be {need}, got {getattr(self, field)!r}")

        def finite(field: str) -> float:
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise bad(field, "a finite number")
            return float(v)

        def registered(field: str, registry) -> None:
            if getattr(self, field) not in registry:
                raise bad(field, f"a registered {registry.kind}, one of {registry.names()} "
                                 f"(add one with {registry.register_hint})")

        if finite("clip_ratio_low") < 0:
            raise bad("clip_ratio_low", ">= 0")
        if self.clip_ratio_low >= 1:
            raise bad("clip_ratio_low", "< 1 (the ratio's lower bound 1 - clip_ratio_low must be > 0)")
        if finite("clip_ratio_high") < 0:
            raise bad("clip_ratio_high", ">= 0")
        if self.dual_clip_c is not None and finite("dual_clip_c") <= 1.0:
            raise bad("dual_clip_c", "> 1 (or None)")
        registered("loss_mode", POLICY_LOSSES)
        registered("loss_agg_mode", LOSS_AGGS)
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
        if finite("entropy_coef") < 0:
            # a bonus on the token-mean entropy; the learner computes entropy with its gradient
            # only for a positive coefficient, so a negative one would fail in the first update
            raise bad("entropy_coef", ">= 0 (the entropy bonus; 0 = off)")
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    def replace(self, **changes) -> "PolicyLossConfig":
        return replace(self, **changes).validate()
