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
lists the private RLlib methods this learner still overrides, and why. The loop, the loss of a
micro-batch, the backward pass, the sharded norm / clip and the optimizer step live in the
Ray-free ``update_core`` (which benchmarks/gpu_learner_check.py runs on a machine without Ray);
this class hands it its RLlib hooks (``_LearnerHooks``).

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

Bad steps (docs/design.md "Fault tolerance"): a non-finite loss or gradient on any rank skips
that optimizer step on every rank (``update_core.step_or_skip``, in every layout); the learner
logs ``skipped_steps`` per update (counted by rank 0 only: the decision is the same on every
rank, and RLlib sums the learners' counts) and its ``StepGuard`` stops the run after
``max_consecutive_skipped_steps`` skipped steps in a row.
"""
from __future__ import annotations

import contextlib
import logging
import math
from typing import Any, ContextManager

import torch
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.annotations import override

from ...core.losses import METRIC_REDUCE, policy_loss
from ...models.threads import apply_torch_threads
from .learner_optim import build_adamw
from .learner_setup import ModuleLayoutMixin, rank
from .learner_vllm_transfer import VLLMTransferMixin
from .learner_state import LEARNER_STATE_KEY, SHARDED_STATE_DIR, LearnerStateMixin, gather_objects
from .microbatching import LossMetrics, total_grad_norm
from .update_core import (
    StepGuard,
    UpdateSettings,
    any_rank,
    backward_share,
    clip_sharded_grads,
    policy_loss_parts,
    recompute_old_logp,
    run_update,
    step_optimizers,
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


class GRPOTorchLearner(LearnerStateMixin, VLLMTransferMixin, ModuleLayoutMixin, TorchLearner):
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
        # skipped optimizer steps over the learner's life: consecutive ones span updates
        self._step_guard = StepGuard(getattr(self.config, "max_consecutive_skipped_steps", None))

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
        ref_logp = fwd_out.get("ref_logp")
        if ref_logp is None and self._ref_model is not None:
            from ...models.logprobs import token_logprobs

            with torch.no_grad(), self._compute_context():
                ref_logp = token_logprobs(self._ref_model, batch["input_ids"], batch["attention_mask"],
                                          temperature=float(config.temperature),
                                          score_mask=batch["loss_mask"] > 0).float()
        # the Ray-free core (update_core); ``policy_loss`` is this module's name for the loss, so
        # that tests can watch its calls
        total, parts = policy_loss_parts(batch, fwd_out, loss_config=lambda replay: config.policy_loss_config(replay=replay),
                                         ref_logp=ref_logp, generator=self._cov_generator, loss_fn=policy_loss)
        for prefix, metrics in parts:
            self._record_loss_metrics(module_id, metrics, prefix)
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

    def _recompute_old_logp(self, module, data: dict, budget: int) -> torch.Tensor:
        """logp_old of the on-policy rows under the current weights (``update_core.recompute_old_logp``)."""
        return recompute_old_logp(_LearnerHooks(self, None, module), data, budget)

    # ------------------------------------------------------------------ update
    @override(TorchLearner)
    def _uncompiled_update(self, batch: dict, **kwargs: Any):
        """``num_epochs`` passes (the width of ``minibatch_id``) over the batch, each one optimizer
        step per mini-batch of that epoch's shuffle: ``num_epochs x num_minibatches`` steps."""
        (module_id, data), = batch.items()
        module = self.module[module_id]
        config = self.config.get_config_for_module(module_id)
        metrics = self._loss_metrics = LossMetrics()
        skipped_before = self._step_guard.skipped
        try:
            # the Ray-free core (update_core) drives the loop through this learner's RLlib hooks
            fwd_out, trained_tokens, steps = run_update(
                _LearnerHooks(self, module_id, module), data, UpdateSettings.of(config), metrics=metrics,
                entropy_generator=self._entropy_generator,
                recompute=lambda d, budget: self._recompute_old_logp(module, d, budget),
                guard=self._step_guard)
        finally:
            self._loss_metrics = None
        if steps:
            # This rank's parameter / gradient / optimizer-state bytes at the last step (shards
            # only under FSDP): what benchmarks/learner_memory.py and the memory planner compare.
            for k, v in self.state_bytes().items():
                self.metrics.log_value((module_id, k), v, reduce="max", window=1)
        total_loss = self._log_update_metrics(module_id, metrics)
        # every rank takes and skips the same steps (one global batch, stepped in lockstep), and
        # RLlib sums the learners' results: rank 0 counts them, so 2 learners do not report 2x
        self.metrics.log_value((module_id, "num_optimizer_steps"), steps if rank() == 0 else 0, reduce="sum")
        skipped = self._step_guard.skipped - skipped_before
        self.metrics.log_value((module_id, "skipped_steps"), skipped if rank() == 0 else 0, reduce="sum")
        self.metrics.log_value((module_id, "trained_tokens"), trained_tokens, reduce="sum")
        return fwd_out, {module_id: torch.tensor(total_loss, dtype=torch.float32)}, {}

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
        backward_share(loss_per_module.values(), self.config.num_learners)
        return {self.get_param_ref(p): p.grad for optim in self._optimizers()
                for group in optim.param_groups for p in group["params"] if p.grad is not None}

    @override(TorchLearner)
    def postprocess_gradients_for_module(self, *, module_id, config=None, module_gradients_dict) -> dict:
        """Log ``grad_norm`` (before clipping), then clip. FSDP: the norm over every rank's shards
        and global-norm clipping of the shards (RLlib's clip and finite checks work on whole
        tensors, not on DTensor shards); a non-finite norm returns no gradients, and
        :meth:`apply_gradients` then skips the step (the same norm on every rank: all skip).
        Non-finite gradients never get here (``update_core.step_or_skip`` skips them first): a
        norm that overflows on finite gradients does."""
        config = config or self.config.get_config_for_module(module_id)
        if not self.is_sharded:
            self.metrics.log_value((module_id, "grad_norm"), total_grad_norm(module_gradients_dict.values()),
                                   window=1000)
            return super().postprocess_gradients_for_module(
                module_id=module_id, config=config, module_gradients_dict=module_gradients_dict)
        # keys: the params (update_core.clip_sharded_grads clips their .grad)
        grad_norm = clip_sharded_grads(module_gradients_dict, getattr(config, "grad_clip", None),
                                       getattr(config, "grad_clip_by", "global_norm"))
        self.metrics.log_value((module_id, "grad_norm"), grad_norm, window=1000)
        if not math.isfinite(grad_norm):
            logger.warning("grad_norm is %s: skipping this optimizer step", grad_norm)
            return {}
        return module_gradients_dict

    @override(TorchLearner)
    def apply_gradients(self, gradients_dict) -> None:
        """RLlib's step when replicated. FSDP: step every optimizer on its shards' gradients, or,
        when :meth:`postprocess_gradients_for_module` returned none (non-finite norm), drop them."""
        if not self.is_sharded:
            return super().apply_gradients(gradients_dict)
        step_optimizers(self._optimizers(), bool(gradients_dict))


class _LearnerHooks:
    """``update_core.UpdateHooks`` of a ``GRPOTorchLearner``: RLlib's update hooks
    (``compute_losses`` -> ``compute_loss_for_module``, ``compute_gradients``,
    ``postprocess_gradients`` -> ``postprocess_gradients_for_module``, ``apply_gradients``) on
    module ``module_id``."""

    def __init__(self, learner: GRPOTorchLearner, module_id: Any, module: torch.nn.Module) -> None:
        self.learner, self.module_id, self.module = learner, module_id, module
        # DDP: one all-reduce per optimizer step (no_sync on the other micro-batches)
        self._replicated_multi = learner.config.num_learners > 1 and not learner.is_sharded

    def forward(self, batch: dict) -> dict:
        return self.module.forward_train(batch)

    def compute_context(self) -> ContextManager:
        return self.learner._compute_context()

    def losses(self, batch: dict, fwd_out: dict) -> dict:
        return self.learner.compute_losses(fwd_out={self.module_id: fwd_out}, batch={self.module_id: batch})

    def backward(self, losses: dict) -> dict:
        return self.learner.compute_gradients(losses)

    def finish_step(self, grads: dict) -> bool:
        processed = self.learner.postprocess_gradients(grads)
        self.learner.apply_gradients(processed)
        # FSDP returns no gradients on a global norm that overflows: that step was dropped
        return bool(processed) or not grads

    def zero_grad(self) -> None:
        for optim in self.learner._optimizers():
            optim.zero_grad(set_to_none=True)

    def max_over_ranks(self, n: int) -> int:
        return self.learner._max_over_ranks(n)

    def any_over_ranks(self, flag: bool) -> bool:
        # every layout, DDP included: one rank's NaN loss must make every rank skip
        return any_rank(flag, self.learner.device)

    def no_sync(self, sync: bool) -> ContextManager:
        return self.module.no_sync() if self._replicated_multi and not sync else contextlib.nullcontext()
