"""The loss of one micro-batch, and the metrics measured beside it (no Ray).

A learner batch may hold on-policy rows and replayed (SIL) rows (``is_replay``): each part gets
its own loss config (``loss_config(replay)``: Clip-Cov's replay parameters) and its own global
normalizer (the batch's ``norm_num_tokens`` / ``norm_num_seqs`` / ``t_norm`` columns), and the
loss is ``sum over parts of loss_weight x policy_loss(part)``. The KL term scores the same rows
under the frozen reference model (``reference``, built by ``module_layout``).

Beside the loss: the engine mismatch |logp_new - engine_logp| (:func:`record_engine_mismatch`)
and the sampled entropy of the ``entropy`` / ``sil_entropy`` metrics (:func:`add_entropy_sample`).
"""
from __future__ import annotations

from typing import Callable, Mapping

import torch

from ..core.losses import LossNormalizer, PolicyLossConfig, policy_loss
from .microbatching import LossMetrics

__all__ = ["ReferenceLogp", "loss_parts", "policy_loss_parts", "record_engine_mismatch", "add_entropy_sample"]

#: The reference policy's log-probs of a micro-batch's loss tokens ([B, T] float32, no grad).
ReferenceLogp = Callable[[Mapping[str, torch.Tensor]], torch.Tensor]


def loss_parts(is_replay: torch.Tensor) -> list[tuple[bool, torch.Tensor | None]]:
    """(replay?, rows) of the batch's on-policy and replayed parts; rows None = every row. One
    host sync decides the parts; a part holding every row is used without indexing (no row
    copies in the forward, no index_put in the backward: the common on-policy case)."""
    is_replay = is_replay.bool()
    n_replay = int(is_replay.sum())
    n_rows = int(is_replay.shape[0])
    parts: list[tuple[bool, torch.Tensor | None]] = []
    if n_replay < n_rows:
        parts.append((False, None if n_replay == 0 else ~is_replay))
    if n_replay > 0:
        parts.append((True, None if n_replay == n_rows else is_replay))
    return parts


def policy_loss_parts(batch: Mapping[str, torch.Tensor], fwd_out: Mapping[str, torch.Tensor], *,
                      loss_config: Callable[[bool], PolicyLossConfig], reference: ReferenceLogp | None = None,
                      generator: torch.Generator | None = None) -> tuple[torch.Tensor, list[tuple[str, dict]]]:
    """A micro-batch's loss: ``sum over parts of loss_weight x policy_loss(part)``, each part
    (on-policy, replayed) with its own loss config (``loss_config(replay)``) and global
    normalizer. ``reference``: the KL term's reference log-probs of the batch (None: no KL
    term). Returns (the loss, [(metric prefix, the part's metrics)]). The loss function is this
    module's ``policy_loss``, looked up per call (tests watch its calls by replacing it)."""
    logp = fwd_out["logp"]
    entropy = fwd_out.get("entropy")
    ref_logp = None if reference is None else reference(batch)
    total = logp.new_zeros(())
    recorded: list[tuple[str, dict]] = []
    for replay, rows in loss_parts(batch["is_replay"]):
        def take(t, rows=rows):
            return t if rows is None else t[rows]
        norm = LossNormalizer(
            num_tokens=float(take(batch["norm_num_tokens"])[0]),
            num_seqs=float(take(batch["norm_num_seqs"])[0]),
            t_norm=float(take(batch["t_norm"])[0]),
        )
        cfg = loss_config(replay)
        loss, metrics = policy_loss(
            take(logp), take(batch["old_logp"]), take(batch["advantages"]),
            take(batch["loss_mask"]), config=cfg, normalizer=norm,
            engine_logp=take(batch["engine_logp"]) if cfg.tis_cap else None,
            ref_logp=None if ref_logp is None else take(ref_logp),
            entropy=None if entropy is None else take(entropy),
            generator=generator,
        )
        weight = float(take(batch["loss_weight"])[0])
        total = total + weight * loss
        recorded.append(("sil_" if replay else "", metrics))
    return total, recorded


def record_engine_mismatch(metrics: LossMetrics, batch: Mapping[str, torch.Tensor],
                           fwd_out: Mapping[str, torch.Tensor]) -> None:
    """|logp_new - engine_logp| over the on-policy loss tokens, into ``metrics``. Called on the
    first mini-batch of an update: before any optimizer step logp_new equals the trainer's
    logp_old. (With TIS the loss measures |engine_logp - logp_old| on every token instead.)"""
    m = (batch["loss_mask"] > 0) & ~batch["is_replay"].bool()[:, None]
    n = int(m.sum())
    if n:
        diff = (fwd_out["logp"].detach() - batch["engine_logp"]).abs()[m]
        metrics.add_token_mean("logp_mismatch_mean", float(diff.mean()), n)
        metrics.add_extreme("logp_mismatch_max", float(diff.max()), "max")


def add_entropy_sample(sums: dict, entropy: torch.Tensor, pick: torch.Tensor, is_replay: torch.Tensor) -> None:
    """Add one micro-batch's sampled entropies to ``sums`` ({replay?: [sum, count]}): the
    on-policy and the replayed rows make the ``entropy`` and ``sil_entropy`` metrics."""
    replay = is_replay.bool()[:, None].expand_as(pick)
    for part in (False, True):
        m = pick & (replay if part else ~replay)
        n = int(m.sum())
        if n:
            sums[part][0] += float(entropy[m].sum())
            sums[part][1] += n
