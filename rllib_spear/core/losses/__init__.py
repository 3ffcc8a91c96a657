"""Token-level policy losses: PPO clip with clip-higher and dual clip (docs/algorithms.md 1.2), global loss
aggregation (1.3), Clip-Cov / KL-Cov entropy control (1.4), truncated importance sampling for
engine/trainer mismatch (1.6), optional KL to a reference policy and entropy bonus.

Pure torch. Every per-token tensor is [B, T] and aligned token by token (see
``core.trajectory``). Aggregation uses *global* normalizers (:class:`LossNormalizer`) computed
once over the whole batch, so that summing the losses of any row-wise split into micro-batches or
learners gives the whole-batch loss and gradient.

Loss modes and aggregation modes are registries, selected by name in :class:`PolicyLossConfig`
(``loss_mode``, ``loss_agg_mode``); add one with :func:`register_policy_loss` /
:func:`register_loss_agg`. Modules: ``modes`` (per-token terms), ``aggregation`` (normalizers
and aggregation modes), ``config`` (:class:`PolicyLossConfig`), ``policy`` (:func:`policy_loss`).
"""
from .aggregation import (
    AGG_MODES,
    LOSS_AGGS,
    LossAggFn,
    LossNormalizer,
    aggregate_token_values,
    get_loss_agg,
    loss_normalizer,
    masked_mean,
    register_loss_agg,
)
from .config import KL_ESTIMATORS, PolicyLossConfig
from .modes import (
    LOSS_MODES,
    POLICY_LOSSES,
    PolicyLossFn,
    PolicyTerms,
    TokenLoss,
    get_policy_loss,
    register_policy_loss,
)
from .policy import METRIC_KIND, METRIC_REDUCE, kl_penalty, policy_loss

__all__ = [
    "LOSS_MODES",
    "AGG_MODES",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "LOSS_AGGS",
    "PolicyLossConfig",
    "PolicyTerms",
    "TokenLoss",
    "PolicyLossFn",
    "LossAggFn",
    "register_policy_loss",
    "register_loss_agg",
    "get_policy_loss",
    "get_loss_agg",
    "METRIC_KIND",
    "METRIC_REDUCE",
    "LossNormalizer",
    "loss_normalizer",
    "aggregate_token_values",
    "masked_mean",
    "kl_penalty",
    "policy_loss",
]
