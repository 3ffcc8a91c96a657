"""GRPOTorchLearner: the policy update of GRPO / Dr.BoT / SPEAR / SPADER on an HF causal LM.

The driver sends one padded batch per learner (whole groups; advantages, masks and the global
loss normalizers already computed). Here:

* rows are split into mini-batches (``minibatch_id`` column; one optimizer step each), and each
  mini-batch into token-budget micro-batches (``microbatching``) whose gradients are accumulated;
* ``num_epochs`` (PPO epochs): the driver writes one mini-batch shuffle per epoch (``minibatch_id``
  is [B, num_epochs]), and the update makes ``num_epochs x num_minibatches`` optimizer steps, each
  epoch's ratio against the same logp_old (recomputed once, before the first step, when the
  trainer recomputes it);
* the loss metrics are combined over the whole update and every learner (``LossMetrics``):
  ``loss`` / ``pg_loss`` are mini-batch losses (the sum of their micro-batch shares), per-token
  means are weighted by each micro-batch's loss tokens, so they do not depend on the
  micro-batch split or the learner count either;
* every loss term uses the normalizers of the *global* mini-batch (all micro-batches of all
  learners), so the gradient does not depend on the micro-batch split or the learner count;
* under DDP (``num_learners > 1``) the all-reduce runs once per optimizer step (``no_sync`` on
  the other micro-batches), and every learner performs the same number of backward passes;
* on-policy rows and replayed (SIL) rows may share a batch (``joint`` mode): each part gets its
  own loss config (Clip-Cov replay parameters) and normalizer, and replay rows are weighted by
  ``loss_weight`` (w_SIL).

The update loop is RLlib's torch update step (``_uncompiled_update``) made to accumulate: per
micro-batch it runs the public hooks ``compute_losses`` (-> ``compute_loss_for_module``) and
``compute_gradients`` (here: backward into the accumulated ``.grad``), and per mini-batch
``postprocess_gradients`` (-> ``postprocess_gradients_for_module``: grad_norm, clipping) and
``apply_gradients`` (the optimizer step). docs/design.md "RLlib private names we still use"
lists the private RLlib methods this learner still overrides, and why.

Sharding (``learners(sharding=...)``, docs/design.md "Learner sharding"; ``learner_setup``):
under "ddp" RLlib wraps the module in DDP; under "fsdp" the module is FSDP2-sharded before the
optimizer is built. FSDP runs collectives in every forward and backward, so every rank runs the
same number of micro-batches (ranks with fewer rows run fully-masked dummy rows) and gradients
are reduce-scattered after every micro-batch. ``mixed_precision="bf16"`` computes in bf16:
FSDP's MixedPrecisionPolicy when sharded, ``torch.autocast`` otherwise. Checkpoints
(``learner_state``): under FSDP torch.distributed.checkpoint folders written by every rank,
loadable with any number of ranks.

Output head: only the loss tokens (``loss_mask > 0``, i.e. assistant tokens after the shift) go
through the output head (``batch["_score_mask"]``, models/logprobs.py); the other positions hold
log-prob 0, which every loss term masks out. The reference model (KL term) and the logp_old
recomputation score the same positions.

Entropy: the full-vocabulary entropy costs an extra pass over the logits of every head chunk
(plus its recomputation in the checkpointed backward). The learner asks the module for it, with
its gradient, on every micro-batch only when ``entropy_coeff > 0`` (the bonus needs it).
Otherwise the ``entropy`` metric (``sil_entropy`` for replayed rows) comes from a uniform random
sample of at most ``entropy_metric_tokens`` loss tokens of the first mini-batch of each update
(``microbatching.entropy_metric_sample``), computed detached on those positions only
(``batch["_entropy_mask"]``): an unbiased estimate of the token-mean entropy at a cost bounded by
the sample, on any batch size. ``entropy_metric_tokens=0`` turns the metric off. The old-log-prob
recomputation never asks for it.

Optimizer: AdamW, fused where torch supports it on the parameters' device (``learner_optim``).
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any

import numpy as np
import torch
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.annotations import override

from ...core.losses import METRIC_REDUCE, LossNormalizer, policy_loss
from ...models import sharding
from ...models.threads import apply_torch_threads
from .learner_optim import build_adamw
from .learner_setup import ModuleLayoutMixin
from .learner_state import LEARNER_STATE_KEY, SHARDED_STATE_DIR, LearnerStateMixin, gather_objects
from .microbatching import (
    LossMetrics,
    dummy_rows,
    entropy_metric_sample,
    epoch_view,
    num_epochs_of,
    slice_rows,
    token_budget_microbatches,
    total_grad_norm,
)

logger = logging.getLogger(__name__)

__all__ = ["GRPOTorchLearner", "BATCH_COLUMNS", "LEARNER_STATE_KEY", "SHARDED_STATE_DIR"]

#: Columns of the learner batch (all [B, T] unless noted [B]).
BATCH_COLUMNS = (
    "input_ids", "attention_mask", "loss_mask", "old_logp", "engine_logp", "advantages",
    "minibatch_id",  # [B, num_epochs] int: the row's mini-batch in each epoch
    "norm_num_tokens", "norm_num_seqs",  # [B, num_epochs] global normalizers of the row's mini-batch part
    "t_norm",  # [B]
    "is_replay", "loss_weight",  # [B]
)


class GRPOTorchLearner(LearnerStateMixin, ModuleLayoutMixin, TorchLearner):
    """TorchLearner with token-budget micro-batching and core.policy_loss."""

    @override(TorchLearner)
    def build(self) -> None:
        apply_torch_threads(getattr(self.config, "torch_num_threads", None))
        self._ref_model = None
        tokens = getattr(self.config, "entropy_metric_tokens", 1024)
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ValueError(f"training(entropy_metric_tokens=...) must be an int >= 0 (0 = no entropy metric), "
                             f"got {tokens!r}")
        super().build()
        # Clip-Cov draws tokens at random, and so does the entropy metric: learner-owned
        # generators, one stream each and per rank (learner_state), keep both reproducible.
        self._seed_generators(int(getattr(self.config, "seed", 0) or 0))
        self._loss_metrics: LossMetrics | None = None  # the metrics of the update in progress

    # ------------------------------------------------------------------ optimizer
    @override(TorchLearner)
    def configure_optimizers_for_module(self, module_id, config=None) -> None:
        config = config or self.config
        module = self.module[module_id]
        params = [p for p in self.get_parameters(module) if p.requires_grad]
        # fused where torch supports it (learner_optim): the step is a few kernels, not one
        # chain per parameter tensor
        optimizer = build_adamw(params, lr=1.0, betas=tuple(config.adam_betas),
                                weight_decay=config.weight_decay, sharded=self.is_sharded)
        lr = config.lr
        warmup = int(getattr(config, "lr_warmup_steps", 0) or 0)
        if warmup > 0 and not isinstance(lr, (list, tuple)):
            # Linear warmup over `warmup` training iterations (the driver passes the iteration
            # index as the schedule's timestep), then constant.
            lr = [[0, lr / (warmup + 1)], [warmup, lr]]
        self.register_optimizer(module_id=module_id, optimizer=optimizer, params=params,
                                lr_or_lr_schedule=lr)

    # ------------------------------------------------------------------ loss
    @override(TorchLearner)
    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out) -> torch.Tensor:
        logp = fwd_out["logp"]
        entropy = fwd_out.get("entropy")
        ref_logp = fwd_out.get("ref_logp")
        if ref_logp is None and self._ref_model is not None:
            from ...models.logprobs import token_logprobs

            with torch.no_grad(), self._compute_context():
                ref_logp = token_logprobs(self._ref_model, batch["input_ids"], batch["attention_mask"],
                                          temperature=float(config.temperature),
                                          score_mask=batch["loss_mask"] > 0).float()
        is_replay = batch["is_replay"].bool()
        total = logp.new_zeros(())
        # One host sync decides the parts; a part holding every row is used without indexing
        # (no row copies in the forward, no index_put in the backward: the common on-policy case).
        n_replay = int(is_replay.sum())
        n_rows = int(is_replay.shape[0])
        parts = []
        if n_replay < n_rows:
            parts.append((False, None if n_replay == 0 else ~is_replay))
        if n_replay > 0:
            parts.append((True, None if n_replay == n_rows else is_replay))
        for replay, rows in parts:
            def take(t, rows=rows):
                return t if rows is None else t[rows]
            norm = LossNormalizer(
                num_tokens=float(take(batch["norm_num_tokens"])[0]),
                num_seqs=float(take(batch["norm_num_seqs"])[0]),
                t_norm=float(take(batch["t_norm"])[0]),
            )
            loss_cfg = config.policy_loss_config(replay=replay)
            loss, metrics = policy_loss(
                take(logp), take(batch["old_logp"]), take(batch["advantages"]),
                take(batch["loss_mask"]), config=loss_cfg, normalizer=norm,
                engine_logp=take(batch["engine_logp"]) if loss_cfg.tis_cap else None,
                ref_logp=None if ref_logp is None else take(ref_logp),
                entropy=None if entropy is None else take(entropy),
                generator=self._cov_generator,
            )
            weight = float(take(batch["loss_weight"])[0])
            total = total + weight * loss
            self._record_loss_metrics(module_id, metrics, "sil_" if replay else "")
        return total

    def _record_loss_metrics(self, module_id, metrics: dict, prefix: str) -> None:
        """One policy_loss call's metrics: into the update's ``LossMetrics`` (combined over the
        micro-batches and learners at its end; nothing for a dummy row), or, called outside an
        update, straight to the logger."""
        sink = getattr(self, "_loss_metrics", None)
        if sink is not None:
            if sink.recording:
                sink.add(metrics, prefix)
            return
        for k, v in metrics.items():
            self.metrics.log_value((module_id, prefix + k), float(v), reduce=METRIC_REDUCE.get(k, "mean"),
                                   window=1000)

    def _record_engine_mismatch(self, batch: dict, fwd_out: dict) -> None:
        """|logp_new - engine_logp| over the on-policy loss tokens, into the update's metrics.
        Call it on the first mini-batch of an update: before any optimizer step logp_new equals
        the trainer's logp_old. (With TIS the loss measures |engine_logp - logp_old| on every
        token instead, and the learner leaves it to the loss.)"""
        m = (batch["loss_mask"] > 0) & ~batch["is_replay"].bool()[:, None]
        n = int(m.sum())
        if n:
            diff = (fwd_out["logp"].detach() - batch["engine_logp"]).abs()[m]
            self._loss_metrics.add_token_mean("logp_mismatch_mean", float(diff.mean()), n)
            self._loss_metrics.add_extreme("logp_mismatch_max", float(diff.max()), "max")

    def _recompute_old_logp(self, module, data: dict, budget: int) -> torch.Tensor:
        """logp_old of the on-policy rows under the current weights (no grad), micro-batched like
        the update. Replayed (SIL) rows keep their stored behaviour log-probs: their ratio is
        pi_theta / pi_behaviour (docs/algorithms.md 2.3), and the current weights are not the
        policy that generated them."""
        out = data["old_logp"].clone()
        on_policy = torch.nonzero(data["is_replay"] == 0).flatten()
        parts = [on_policy[p] for p in token_budget_microbatches(data["attention_mask"][on_policy], budget)]
        # FSDP: every rank runs the same number of forwards (the others score a dummy row).
        parts = parts + [None] * (self._max_over_ranks(len(parts)) - len(parts))
        with torch.no_grad(), self._compute_context():
            for part in parts:
                sub = dummy_rows(data) if part is None else slice_rows(data, part)
                sub["_need_entropy"] = False
                sub["_score_mask"] = sub["loss_mask"] > 0
                logp = module.forward_train(sub)["logp"]
                if part is not None:
                    logp = logp.detach().float()
                    out[part, :logp.shape[1]] = logp * sub["loss_mask"]
        return out

    @staticmethod
    def _add_entropy_sample(sums: dict, entropy: torch.Tensor, pick: torch.Tensor, is_replay: torch.Tensor) -> None:
        """Add one micro-batch's sampled entropies to ``sums`` ({replay?: [sum, count]}): the
        on-policy and the replayed rows make the ``entropy`` and ``sil_entropy`` metrics."""
        replay = is_replay.bool()[:, None].expand_as(pick)
        for part in (False, True):
            m = pick & (replay if part else ~replay)
            n = int(m.sum())
            if n:
                sums[part][0] += float(entropy[m].sum())
                sums[part][1] += n

    # ------------------------------------------------------------------ update
    @override(TorchLearner)
    def _uncompiled_update(self, batch: dict, **kwargs: Any):
        """``num_epochs`` passes (the width of ``minibatch_id``) over the batch, each one optimizer
        step per mini-batch of that epoch's shuffle: ``num_epochs x num_minibatches`` steps."""
        (module_id, data), = batch.items()
        module = self.module[module_id]
        config = self.config.get_config_for_module(module_id)
        num_epochs = num_epochs_of(data)
        num_minibatches = int(data["num_minibatches"][0]) if len(data["input_ids"]) else 0
        if getattr(config, "recompute_old_logprobs", False) or config.policy_loss_config().tis_cap:
            # Trainer-side logp_old (1.6): the ratio is taken against the trainer's numerics and
            # the engine log-probs only enter the truncated importance weight. Once, before the
            # first step: every epoch's ratio is against the policy before the update (PPO).
            data = dict(data)
            data["old_logp"] = self._recompute_old_logp(module, epoch_view(data, 0),
                                                        int(config.micro_batch_token_budget))
        fwd_out: dict = {}
        trained_tokens = 0
        metrics = self._loss_metrics = LossMetrics()
        try:
            for epoch in range(num_epochs):
                view = epoch_view(data, epoch)
                for mb in range(num_minibatches):
                    metrics.step = (epoch, mb)
                    fwd_out, tokens = self._minibatch_step(module_id, module, config, view, mb,
                                                           first=epoch == 0 and mb == 0)
                    trained_tokens += tokens
        finally:
            self._loss_metrics = None
        steps = num_epochs * num_minibatches
        if steps:
            # This rank's parameter / gradient / optimizer-state bytes at the last step (shards
            # only under FSDP): what benchmarks/learner_memory.py and the memory planner compare.
            for k, v in self.state_bytes().items():
                self.metrics.log_value((module_id, k), v, reduce="max", window=1)
        total_loss = self._log_update_metrics(module_id, metrics)
        self.metrics.log_value((module_id, "num_optimizer_steps"), steps, reduce="sum")
        self.metrics.log_value((module_id, "trained_tokens"), trained_tokens, reduce="sum")
        return fwd_out, {module_id: torch.tensor(total_loss, dtype=torch.float32)}, {}

    def _minibatch_step(self, module_id, module, config, data: dict, mb: int, *, first: bool) -> tuple[dict, int]:
        """One optimizer step on mini-batch ``mb`` of ``data`` (one epoch's view,
        ``microbatching.epoch_view``): gradients accumulated over its token-budget micro-batches.
        ``first``: the update's first step (entropy sample, engine mismatch). Returns (the last
        micro-batch's forward outputs, the tokens trained on)."""
        rows = torch.nonzero(data["minibatch_id"].long() == mb).flatten()
        micro = token_budget_microbatches(data["attention_mask"][rows], int(config.micro_batch_token_budget))
        # A learner without rows of this mini-batch joins the collectives with dummy rows;
        # under FSDP every forward is a collective, so every rank runs as many micro-batches.
        n_micro = self._max_over_ranks(max(len(micro), 1))
        micro = micro + [None] * (n_micro - len(micro))
        # Entropy on every micro-batch only when the bonus needs it (with its gradient); else a
        # bounded uniform sample of the first mini-batch's loss tokens, detached, for the metric.
        entropy_always = float(getattr(config, "entropy_coeff", 0.0) or 0.0) > 0
        metric_tokens = int(getattr(config, "entropy_metric_tokens", 1024))
        sampled = first and not entropy_always and metric_tokens > 0
        if sampled:
            data = dict(data)
            pick = torch.zeros_like(data["loss_mask"], dtype=torch.bool)
            pick[rows] = entropy_metric_sample(data["loss_mask"][rows], metric_tokens, self._entropy_generator)
            data["entropy_metric_mask"] = pick
        # with TIS the loss measures the engine mismatch on every token (_record_engine_mismatch)
        mismatch = first and not config.policy_loss_config().tis_cap
        replicated_multi = self.config.num_learners > 1 and not self.is_sharded
        sums = {False: [0.0, 0], True: [0.0, 0]}  # part (replay?) -> [entropy sum, tokens]
        fwd_out: dict = {}
        trained_tokens = 0
        for optim in self._optimizers():
            optim.zero_grad(set_to_none=True)
        for i, part in enumerate(micro):
            sync = i == len(micro) - 1
            # DDP: one all-reduce per optimizer step
            ctx = module.no_sync() if replicated_multi and not sync else contextlib.nullcontext()
            with ctx:
                sub = dummy_rows(data) if part is None else slice_rows(data, rows[part])
                sub["_need_entropy"] = entropy_always
                # only the loss tokens go through the output head (models/logprobs.py)
                sub["_score_mask"] = sub["loss_mask"] > 0
                pick = sub.pop("entropy_metric_mask", None)
                if sampled:
                    sub["_entropy_mask"] = pick
                with self._compute_context():
                    fwd_out = module.forward_train(sub)
                fwd_out = {k: v.float() for k, v in fwd_out.items()}
                if sampled and part is not None:
                    self._add_entropy_sample(sums, fwd_out["entropy_sample"], pick, sub["is_replay"])
                # a dummy row's metrics are not the batch's: it records none
                self._loss_metrics.recording = part is not None
                losses = self.compute_losses(fwd_out={module_id: fwd_out}, batch={module_id: sub})
                self._loss_metrics.recording = True
                if part is None:
                    losses = {mid: loss * 0.0 for mid, loss in losses.items()}
                else:
                    self._loss_metrics.add_share(LossMetrics.TOTAL, float(losses[module_id].detach()))
                    trained_tokens += int(sub["attention_mask"].sum())
                    if mismatch:
                        self._record_engine_mismatch(sub, fwd_out)
                grads = self.compute_gradients(losses)
        for replay, (total, count) in sums.items():
            self._loss_metrics.add_token_mean(("sil_" if replay else "") + "entropy", total / max(count, 1), count)
        self.apply_gradients(self.postprocess_gradients(grads))
        return fwd_out, trained_tokens

    def _log_update_metrics(self, module_id, metrics: LossMetrics) -> float:
        """Log the update's loss metrics, combined over every learner's micro-batches (one
        gather, which also brings every rank's generator states to rank 0 for its checkpoint:
        learner_state), and return the update's loss ``LossMetrics.total_loss``: what RLlib logs
        as ``total_loss``, the same on every learner and for any micro-batch split."""
        gathered = gather_objects({"metrics": metrics.state(), "rng": self._rng_state()})
        self._remember_rank_rng_states([g["rng"] for g in gathered])
        merged = LossMetrics.merged(g["metrics"] for g in gathered)
        for key, (value, reduce) in merged.results().items():
            self.metrics.log_value((module_id, key), value, reduce=reduce, window=1000)
        return merged.total_loss()

    # ------------------------------------------------------------------ gradients
    @override(TorchLearner)
    def compute_gradients(self, loss_per_module, **kwargs) -> dict:
        """Backward of one micro-batch's loss into the accumulated ``.grad`` (the update loop
        zeroes the gradients once per mini-batch, not here), scaled by the learner count: DDP
        and FSDP average gradients over learners, while each learner's loss is already its share
        of the global-batch loss (global normalizers). Returns ``{param: accumulated grad}``."""
        losses = list(loss_per_module.values())
        total = losses[0]
        for loss in losses[1:]:
            total = total + loss
        n = self.config.num_learners
        (total * (float(n) if n > 1 else 1.0)).backward()
        return {self.get_param_ref(p): p.grad for optim in self._optimizers()
                for group in optim.param_groups for p in group["params"] if p.grad is not None}

    @override(TorchLearner)
    def postprocess_gradients_for_module(self, *, module_id, config=None, module_gradients_dict) -> dict:
        """Log ``grad_norm`` (before clipping), then clip. FSDP: the norm over every rank's shards
        and global-norm clipping of the shards (RLlib's clip and finite checks work on whole
        tensors, not on DTensor shards); a non-finite norm returns no gradients, and
        :meth:`apply_gradients` then skips the step (the same norm on every rank: all skip)."""
        config = config or self.config.get_config_for_module(module_id)
        if not self.is_sharded:
            self.metrics.log_value((module_id, "grad_norm"), total_grad_norm(module_gradients_dict.values()),
                                   window=1000)
            return super().postprocess_gradients_for_module(
                module_id=module_id, config=config, module_gradients_dict=module_gradients_dict)
        norm = sharding.global_grad_norm(module_gradients_dict.values())
        grad_norm = float(norm)
        self.metrics.log_value((module_id, "grad_norm"), grad_norm, window=1000)
        if not np.isfinite(grad_norm):
            logger.warning("grad_norm is %s: skipping this optimizer step", grad_norm)
            return {}
        clip = getattr(config, "grad_clip", None)
        if clip is not None and getattr(config, "grad_clip_by", "global_norm") == "global_norm":
            sharding.clip_grads_(list(module_gradients_dict), float(clip), norm)  # keys: the params
        elif clip is not None:
            raise ValueError("sharding='fsdp' supports grad_clip_by='global_norm' only")
        return module_gradients_dict

    @override(TorchLearner)
    def apply_gradients(self, gradients_dict) -> None:
        """RLlib's step when replicated. FSDP: step every optimizer on its shards' gradients, or,
        when :meth:`postprocess_gradients_for_module` returned none (non-finite norm), drop them."""
        if not self.is_sharded:
            return super().apply_gradients(gradients_dict)
        for optim in self._optimizers():
            if gradients_dict:
                optim.step()
            else:
                optim.zero_grad(set_to_none=True)
