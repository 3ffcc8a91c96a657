"""Policy-loss modes: the per-token term of :func:`~rllib_spear.core.losses.policy_loss`, by name.

A mode is a function ``fn(terms, config) -> TokenLoss`` registered with
:func:`register_policy_loss` and selected by ``PolicyLossConfig(loss_mode=name)``.
``terms`` (:class:`PolicyTerms`) holds the pieces every mode shares (masked inputs, the ratio,
the two PPO candidates); the mode returns the per-token loss and, for the metrics, which tokens
it clipped or otherwise treated specially. Importance weights, the KL and entropy terms and the
aggregation are applied by ``policy_loss`` around it. Built-ins (docs/algorithms.md 1.2, 1.4):
``vanilla``, ``clip_cov``, ``kl_cov``.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ...registry import Registry

if TYPE_CHECKING:
    from .config import PolicyLossConfig

__all__ = ["LOSS_MODES", "POLICY_LOSSES", "PolicyTerms", "TokenLoss", "PolicyLossFn", "register_policy_loss",
           "get_policy_loss"]


@dataclass(frozen=True)
class PolicyTerms:
    """The shared per-token pieces of one ``policy_loss`` call, all [B, T] in ``logp``'s dtype.

    Under mask 0, ``old_logp`` equals ``logp`` (detached) and ``advantages`` is 0, so whatever
    padding held (-inf / NaN) cannot reach a value or a gradient.

    Attributes:
        logp: the new log-probs; the only input that carries gradient.
        old_logp / advantages: detached, neutralised under mask 0.
        mask: the loss mask in ``logp``'s dtype; ``valid = mask > 0``; ``n_valid`` its count.
        log_ratio: ``logp - old_logp`` (not clamped; has gradient).
        ratio: ``exp(clamp(log_ratio, -20, 20))``.
        loss_unclipped / loss_clipped: the PPO candidates ``-A*ratio`` and
            ``-A*clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)``.
        ppo_clipped: valid tokens where the clipped candidate is the larger (``l2 > l1``).
        generator: the caller's generator for modes that draw at random.
    """

    logp: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    valid: torch.Tensor
    n_valid: int
    log_ratio: torch.Tensor
    ratio: torch.Tensor
    loss_unclipped: torch.Tensor
    loss_clipped: torch.Tensor
    ppo_clipped: torch.Tensor
    generator: torch.Generator | None = None


@dataclass(frozen=True)
class TokenLoss:
    """What a mode returns: the per-token loss [B, T] and boolean [B, T] masks for the metrics.

    ``clipped``: tokens the PPO clip bound (``pg_clipfrac*``; None = the mode applies no clip, the
    fractions are 0). ``dual_clipped``: tokens the dual clip bound (``pg_clipfrac_dual``).
    ``cov_selected``: tokens a covariance rule changed (``cov_fraction``). None counts as none.
    """

    loss: torch.Tensor
    clipped: torch.Tensor | None = None
    dual_clipped: torch.Tensor | None = None
    cov_selected: torch.Tensor | None = None


PolicyLossFn = Callable[[PolicyTerms, "PolicyLossConfig"], TokenLoss]

#: Policy-loss modes by name (``PolicyLossConfig.loss_mode``).
POLICY_LOSSES: Registry[PolicyLossFn] = Registry(
    "policy loss mode", register_hint="rllib_spear.core.losses.register_policy_loss")


def register_policy_loss(name: str, fn: PolicyLossFn | None = None, *, override: bool = False):
    """Register a policy-loss mode under ``name`` (decorator when ``fn`` is omitted).

    ``fn(terms: PolicyTerms, config: PolicyLossConfig) -> TokenLoss``. Select it with
    ``PolicyLossConfig(loss_mode=name)``. Example, a plain REINFORCE term::

        @register_policy_loss("reinforce")
        def reinforce(terms, config):
            return TokenLoss(-terms.advantages * terms.logp)
    """
    return POLICY_LOSSES.register(name, fn, override=override)


def get_policy_loss(name: str) -> PolicyLossFn:
    """The mode registered as ``name`` (ValueError listing the registered modes otherwise)."""
    return POLICY_LOSSES.get(name)


@register_policy_loss("vanilla")
def vanilla(terms: PolicyTerms, config: "PolicyLossConfig") -> TokenLoss:
    """PPO clip (docs/algorithms.md 1.2): ``l = max(l1, l2)``; with ``dual_clip_c = c`` and A < 0,
    ``l = min(l, -A*c)``."""
    tok = torch.maximum(terms.loss_unclipped, terms.loss_clipped)
    dual = None
    if config.dual_clip_c is not None:
        adv = terms.advantages
        loss3 = -adv * config.dual_clip_c
        neg = adv < 0
        dual = neg & (tok > loss3) & terms.valid
        tok = torch.where(neg, torch.minimum(tok, loss3), tok)
    return TokenLoss(tok, clipped=terms.ppo_clipped, dual_clipped=dual)


@register_policy_loss("clip_cov")
def clip_cov(terms: PolicyTerms, config: "PolicyLossConfig") -> TokenLoss:
    """Clip-Cov (docs/algorithms.md 1.4): ``l = max(l1, l2) * corr``.

    With ``cov = (A - mean_v A) * (logp - mean_v logp)`` over the valid tokens of this call,
    candidates are valid tokens not PPO-clipped with ``lb < cov < ub``; ``min(k, #candidates)`` of
    them, ``k = max(floor(r * sum(m)), 1)``, chosen uniformly at random with ``terms.generator``,
    get ``corr = 0`` (value and gradient 0; they stay in the denominators). No dual clip, as
    released."""
    valid = terms.valid
    tok = torch.maximum(terms.loss_unclipped, terms.loss_clipped)
    cov = token_cov(terms.advantages, terms.logp.detach(), valid)
    cand = valid & ~terms.ppo_clipped & (cov > config.clip_cov_lb) & (cov < config.clip_cov_ub)
    cand_idx = torch.nonzero(cand)  # row-major order, like the released code
    k = max(int(config.clip_cov_ratio * float(terms.mask.sum().item())), 1)
    affected = torch.zeros_like(valid)
    if cand_idx.shape[0] > 0:
        generator = terms.generator
        gdev = generator.device if generator is not None else cand_idx.device
        perm = torch.randperm(cand_idx.shape[0], generator=generator, device=gdev)
        chosen = cand_idx[perm[: min(k, cand_idx.shape[0])].to(cand_idx.device)]
        affected[chosen[:, 0], chosen[:, 1]] = True
    # Multiply by 0 (not drop): value and gradient vanish, denominators are unchanged.
    tok = tok * (~affected).to(terms.logp.dtype)
    return TokenLoss(tok, clipped=terms.ppo_clipped, cov_selected=affected)


@register_policy_loss("kl_cov")
def kl_cov(terms: PolicyTerms, config: "PolicyLossConfig") -> TokenLoss:
    """KL-Cov (docs/algorithms.md 1.4): the top ``k = max(1, floor(r * N_valid))`` valid tokens by
    cov (ties: lower flat index first) get ``l = l1 + kl_cov_coef * |logp - old_logp|``; all
    others ``l = l1``. No PPO clip."""
    loss1, valid = terms.loss_unclipped, terms.valid
    tok = loss1
    affected = torch.zeros_like(valid)
    if terms.n_valid > 0:
        cov = token_cov(terms.advantages, terms.logp.detach(), valid)
        flat_valid = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
        cov_valid = cov.reshape(-1)[flat_valid]
        k = max(1, int(terms.n_valid * config.kl_cov_ratio))
        # Stable descending sort: ties go to the lower flat index (torch.topk is unspecified).
        order = torch.sort(cov_valid, descending=True, stable=True).indices[:k]
        affected.view(-1)[flat_valid[order]] = True
        tok = torch.where(affected, loss1 + config.kl_cov_coef * terms.log_ratio.abs(), loss1)
    return TokenLoss(tok, cov_selected=affected)


#: The built-in policy-loss modes (``POLICY_LOSSES.names()`` also lists registered ones).
LOSS_MODES = ("vanilla", "clip_cov", "kl_cov")


def token_cov(adv: torch.Tensor, logp: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``(A - mean_v A) * (logp - mean_v logp)`` with means over valid tokens; -inf elsewhere."""
    n = valid.sum()
    if int(n.item()) == 0:
        return torch.full_like(adv, -math.inf)
    a_mean = torch.where(valid, adv, torch.zeros_like(adv)).sum() / n
    l_mean = torch.where(valid, logp, torch.zeros_like(logp)).sum() / n
    cov = (adv - a_mean) * (logp - l_mean)
    return torch.where(valid, cov, torch.full_like(cov, -math.inf))
