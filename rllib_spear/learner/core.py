"""The learner's update, end to end, without RLlib or Ray: :class:`UpdateCore`.

Given the model's forward pass, its optimizers, the update's settings and a small object of
distributed ops (:class:`RankOps`: max / any over the learner ranks, DDP's ``no_sync``), one
call of :meth:`UpdateCore.update` runs the whole update of a learner batch:

* ``num_epochs`` (PPO epochs; the width of ``minibatch_id``) passes over the batch, each one
  optimizer step per mini-batch of that epoch's shuffle; logp_old recomputed once, before the
  first step, with TIS or ``recompute_old_logprobs`` (every epoch's ratio is against the policy
  before the update);
* per mini-batch, token-budget micro-batches (``microbatching``): forward, loss
  (``loss.policy_loss_parts``), backward into the accumulated ``.grad``; ranks with fewer
  micro-batches run fully-masked dummy rows where every forward is a collective (FSDP), and DDP
  all-reduces once per step (``no_sync`` on the other micro-batches);
* at the step boundary: the rule of every layout (a non-finite loss or gradient on any rank
  skips the step on every rank, ``steps.bad_step_reason``), the norm and clip of the layout
  (``steps.ReplicatedClip`` / ``steps.ShardedClip``), the optimizer step, and the run-long
  ``steps.StepGuard``;
* the loss metrics of every micro-batch, combined so that they do not depend on the split
  (``microbatching.LossMetrics``), and the entropy metric on a bounded uniform sample of the
  first mini-batch's loss tokens (``microbatching.entropy_metric_sample``) unless the entropy
  bonus needs it on every token.

It returns an :class:`UpdateResult`; the caller logs it. The RLlib learner
(``rllib_learner.GRPOTorchLearner``) builds one core per update from its module and optimizers
and makes one call; nothing here calls back into it. :class:`LocalUpdate` is the same update
for a bare model and optimizer: benchmarks/gpu_learner_check.py trains through it on a machine
without Ray, and tests/learner/test_update_core.py checks that it moves the weights as the RLlib
learner does.

Nothing here imports Ray (tests/benchmarks/test_gpu_learner_check.py imports it with Ray blocked).
"""
from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Mapping, Protocol

import torch

from ..core.losses import PolicyLossConfig
from .loss import ReferenceLogp, add_entropy_sample, policy_loss_parts, record_engine_mismatch
from .microbatching import (
    LossMetrics,
    dummy_rows,
    entropy_metric_sample,
    epoch_view,
    num_epochs_of,
    slice_rows,
    token_budget_microbatches,
)
from .ranks import ProcessGroupRanks
from .state import seeded_generator
from .steps import (
    ReplicatedClip,
    ShardedClip,
    StepGuard,
    StepNorms,
    backward_share,
    bad_step_reason,
    step_optimizers,
)

logger = logging.getLogger(__name__)

__all__ = ["RankOps", "UpdateSettings", "UpdateResult", "UpdateCore", "LocalUpdate"]


class RankOps(Protocol):
    """The distributed ops of an update (``ranks.ProcessGroupRanks`` over torch.distributed)."""

    def max(self, n: int) -> int:
        """max(n) over the ranks that must run as many forwards (FSDP); else ``n``."""

    def any(self, flag: bool) -> bool:
        """``flag`` or'ed over every learner rank, in any layout."""

    def no_sync(self, sync: bool) -> ContextManager:
        """DDP's ``no_sync`` on micro-batches that do not end the step (``sync`` False)."""


class UpdateSettings:
    """The knobs of one update, read from a learner config (``GRPOConfig`` or any object with its
    attribute names): token budget, entropy bonus / metric sample, TIS, logp_old recomputation."""

    def __init__(self, *, micro_batch_token_budget: int, entropy_coeff: float = 0.0,
                 entropy_metric_tokens: int = 1024, tis: bool = False,
                 recompute_old_logprobs: bool = False, packed_microbatches: bool = False) -> None:
        self.budget = int(micro_batch_token_budget)
        # packed micro-batches: the budget counts real tokens (microbatching.token_budget_microbatches)
        self.packed = bool(packed_microbatches)
        self.entropy_always = float(entropy_coeff or 0.0) > 0
        self.metric_tokens = int(entropy_metric_tokens)
        self.tis = bool(tis)
        self.recompute_old_logprobs = bool(recompute_old_logprobs)

    @classmethod
    def of(cls, config: Any) -> "UpdateSettings":
        return cls(micro_batch_token_budget=int(config.micro_batch_token_budget),
                   entropy_coeff=float(getattr(config, "entropy_coeff", 0.0) or 0.0),
                   entropy_metric_tokens=int(getattr(config, "entropy_metric_tokens", 1024)),
                   tis=bool(config.policy_loss_config().tis_cap),
                   recompute_old_logprobs=bool(getattr(config, "recompute_old_logprobs", False)),
                   packed_microbatches=bool(getattr(config, "packed_microbatches", False)))


@dataclass
class UpdateResult:
    """What one update did: the last micro-batch's forward outputs, the tokens trained on, the
    optimizer steps applied and skipped, the loss metrics of this rank's micro-batches (merge
    the learners' with ``LossMetrics.merged``), and each clipped step's norms."""

    fwd_out: dict
    trained_tokens: int
    steps: int
    skipped: int
    metrics: LossMetrics
    step_norms: list[StepNorms] = field(default_factory=list)


class UpdateCore:
    """The update of a learner batch (see the module docstring).

    ``forward(batch) -> {"logp", "entropy"?, "entropy_sample"?}``: the module's forward pass on
    a micro-batch (``models.hf_policy.score_batch``; under DDP the wrapped module's).
    ``optimizers``: {name: optimizer}, stepped in that order. ``loss_config(replay)``: the
    policy-loss config of the on-policy (False) or replayed (True) rows. ``clip``: the layout's
    norm and clip (``steps.ReplicatedClip`` / ``steps.ShardedClip``). ``num_learners``: the
    learner count (each learner's loss is its share of the global loss; DDP and FSDP average).
    ``compute_context()``: where forwards run (bf16 autocast on a replicated learner under mixed
    precision). ``reference``: the KL term's reference log-probs (None: no KL term).
    ``cov_generator`` / ``entropy_generator``: the streams of Clip-Cov's draws and of the
    entropy-metric sample. ``guard``: the run-long count of skipped steps.
    """

    def __init__(self, *, forward: Callable[[dict], dict], optimizers: Mapping[str, torch.optim.Optimizer],
                 settings: UpdateSettings, loss_config: Callable[[bool], PolicyLossConfig],
                 clip: Callable[[Mapping[str, torch.optim.Optimizer], dict], StepNorms], ranks: RankOps,
                 entropy_generator: torch.Generator, cov_generator: torch.Generator | None = None,
                 num_learners: int = 1, compute_context: Callable[[], ContextManager] = contextlib.nullcontext,
                 reference: ReferenceLogp | None = None, guard: StepGuard | None = None) -> None:
        self.forward = forward
        self.optimizers = dict(optimizers)
        self.settings = settings
        self.loss_config = loss_config
        self.clip = clip
        self.ranks = ranks
        self.entropy_generator = entropy_generator
        self.cov_generator = cov_generator
        self.num_learners = int(num_learners)
        self.compute_context = compute_context
        self.reference = reference
        self.guard = guard if guard is not None else StepGuard()

    # ------------------------------------------------------------------ the update
    def update(self, data: dict) -> UpdateResult:
        """``num_epochs x num_minibatches`` optimizer steps on the learner batch ``data``
        (``recipe.batching.build_learner_batches``; tensors on the model's device)."""
        result = UpdateResult(fwd_out={}, trained_tokens=0, steps=0, skipped=0, metrics=LossMetrics())
        skipped_before = self.guard.skipped
        num_epochs = num_epochs_of(data)
        num_minibatches = int(data["num_minibatches"][0]) if len(data["input_ids"]) else 0
        if self.settings.recompute_old_logprobs or self.settings.tis:
            # Trainer-side logp_old (1.6): the ratio is taken against the trainer's numerics and
            # the engine log-probs only enter the truncated importance weight.
            data = dict(data)
            data["old_logp"] = self.recompute_old_logp(epoch_view(data, 0))
        for epoch in range(num_epochs):
            view = epoch_view(data, epoch)
            for mb in range(num_minibatches):
                result.metrics.step = (epoch, mb)
                self._minibatch_step(view, mb, result, first=epoch == 0 and mb == 0)
        result.skipped = self.guard.skipped - skipped_before
        result.steps = num_epochs * num_minibatches - result.skipped
        return result

    def recompute_old_logp(self, data: dict) -> torch.Tensor:
        """logp_old of the on-policy rows under the current weights (no grad), micro-batched like
        the update. Replayed (SIL) rows keep their stored behaviour log-probs: their ratio is
        pi_theta / pi_behaviour (docs/algorithms.md 2.3), and the current weights are not the
        policy that generated them."""
        out = data["old_logp"].clone()
        on_policy = torch.nonzero(data["is_replay"] == 0).flatten()
        parts = [on_policy[p] for p in token_budget_microbatches(data["attention_mask"][on_policy],
                                                                 self.settings.budget,
                                                                 packed=self.settings.packed)]
        # FSDP: every rank runs the same number of forwards (the others score a dummy row).
        parts = parts + [None] * (self.ranks.max(len(parts)) - len(parts))
        with torch.no_grad(), self.compute_context():
            for part in parts:
                sub = dummy_rows(data) if part is None else slice_rows(data, part)
                sub["_need_entropy"] = False
                sub["_score_mask"] = sub["loss_mask"] > 0
                logp = self.forward(sub)["logp"]
                if part is not None:
                    logp = logp.detach().float()
                    out[part, :logp.shape[1]] = logp * sub["loss_mask"]
        return out

    def _minibatch_step(self, data: dict, mb: int, result: UpdateResult, *, first: bool) -> None:
        """One optimizer step on mini-batch ``mb`` of ``data`` (one epoch's view,
        ``microbatching.epoch_view``): gradients accumulated over its token-budget
        micro-batches, then :meth:`step_or_skip`. ``first``: the update's first step (entropy
        sample, engine mismatch)."""
        settings, metrics = self.settings, result.metrics
        rows = torch.nonzero(data["minibatch_id"].long() == mb).flatten()
        micro = token_budget_microbatches(data["attention_mask"][rows], settings.budget, packed=settings.packed)
        # A learner without rows of this mini-batch joins the collectives with dummy rows;
        # under FSDP every forward is a collective, so every rank runs as many micro-batches.
        n_micro = self.ranks.max(max(len(micro), 1))
        micro = micro + [None] * (n_micro - len(micro))
        # Entropy on every micro-batch only when the bonus needs it (with its gradient); else a
        # bounded uniform sample of the first mini-batch's loss tokens, detached, for the metric.
        sampled = first and not settings.entropy_always and settings.metric_tokens > 0
        if sampled:
            data = dict(data)
            pick = torch.zeros_like(data["loss_mask"], dtype=torch.bool)
            pick[rows] = entropy_metric_sample(data["loss_mask"][rows], settings.metric_tokens,
                                               self.entropy_generator)
            data["entropy_metric_mask"] = pick
        # with TIS the loss measures the engine mismatch on every token (record_engine_mismatch)
        mismatch = first and not settings.tis
        sums = {False: [0.0, 0], True: [0.0, 0]}  # part (replay?) -> [entropy sum, tokens]
        loss_finite = True
        self._zero_grad()
        for i, part in enumerate(micro):
            with self.ranks.no_sync(i == len(micro) - 1):  # DDP: one all-reduce per optimizer step
                sub = dummy_rows(data) if part is None else slice_rows(data, rows[part])
                sub["_need_entropy"] = settings.entropy_always
                # only the loss tokens go through the output head (models/logprobs.py)
                sub["_score_mask"] = sub["loss_mask"] > 0
                pick = sub.pop("entropy_metric_mask", None)
                if sampled:
                    sub["_entropy_mask"] = pick
                with self.compute_context():
                    fwd_out = self.forward(sub)
                fwd_out = {k: v.float() for k, v in fwd_out.items()}
                if sampled and part is not None:
                    add_entropy_sample(sums, fwd_out["entropy_sample"], pick, sub["is_replay"])
                loss, parts = self.loss(sub, fwd_out)
                if part is None:
                    loss = loss * 0.0  # a dummy row: no gradient, and its metrics are not the batch's
                else:
                    for prefix, m in parts:
                        metrics.add(m, prefix)
                    share = float(loss.detach())
                    loss_finite = loss_finite and math.isfinite(share)
                    metrics.add_share(LossMetrics.TOTAL, share)
                    result.trained_tokens += int(sub["attention_mask"].sum())
                    if mismatch:
                        record_engine_mismatch(metrics, sub, fwd_out)
                self.backward(loss)
        result.fwd_out = fwd_out
        for replay, (total, count) in sums.items():
            metrics.add_token_mean(("sil_" if replay else "") + "entropy", total / max(count, 1), count)
        self.guard.record(self.step_or_skip(loss_finite, result.step_norms))

    # ------------------------------------------------------------------ one micro-batch
    def loss(self, batch: dict, fwd_out: dict) -> tuple[torch.Tensor, list[tuple[str, dict]]]:
        """A micro-batch's loss and its parts' metrics (``loss.policy_loss_parts``)."""
        return policy_loss_parts(batch, fwd_out, loss_config=self.loss_config, reference=self.reference,
                                 generator=self.cov_generator)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward into the accumulated ``.grad`` (``steps.backward_share``)."""
        backward_share(loss, self.num_learners)

    # ------------------------------------------------------------------ the step
    def step_or_skip(self, loss_finite: bool, step_norms: list[StepNorms]) -> bool:
        """The optimizer step of one mini-batch, or its skip: the rule of every layout. The step is
        skipped on every rank when the loss or the gradient is non-finite on any rank (a flag
        or'ed over the ranks: DDP all-reduces the gradients but not the loss, and a rank that
        stepped while another skipped would hold other weights from then on), or when the
        layout's clip drops it. Skipping drops the gradients: no weight and no optimizer state
        changes. The clip's norms go to ``step_norms``. Returns whether the step was applied."""
        grads = {p: p.grad for optim in self.optimizers.values() for group in optim.param_groups
                 for p in group["params"] if p.grad is not None}
        reason = bad_step_reason(loss_finite, grads.values())
        if self.ranks.any(reason is not None):
            logger.warning("skipping this optimizer step: %s",
                           reason or "a non-finite loss or gradient on another rank")
            self._zero_grad()
            return False
        norms = self.clip(self.optimizers, grads)
        step_norms.append(norms)
        if not norms.applied:
            logger.warning("grad_norm is %s: skipping this optimizer step", norms.grad_norm)
        step_optimizers(self.optimizers.values(), norms.applied)
        return norms.applied

    def _zero_grad(self) -> None:
        for optim in self.optimizers.values():
            optim.zero_grad(set_to_none=True)


# ---------------------------------------------------------------------- one process, no RLlib
class LocalUpdate:
    """The learner's update for a bare model: ``model`` (an HF causal LM, plain or FSDP2-sharded
    with ``models.sharding.shard_causal_lm``), its ``optimizer`` (``optim.build_adamw``) and the
    loss configs, through an :class:`UpdateCore` (``core``). Under a process group of several
    ranks every rank calls :meth:`update` on its own rows (FSDP: the gradients are
    reduce-scattered; the loss scale and clipping are the sharded learner's).

    Clipping: the global norm over every parameter's gradient (``steps.ShardedClip``), as the
    learner clips under FSDP; replicated, RLlib's clip computes the same norm (to float
    rounding) and so the same step. The random streams are the learner's rank-0 streams
    (``state.seeded_generator``).
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 loss_config: PolicyLossConfig | Callable[[bool], PolicyLossConfig],
                 settings: UpdateSettings, device: torch.device | str, temperature: float = 1.0,
                 chunk_size: int | None = None, grad_clip: float | None = None,
                 num_learners: int = 1, seed: int = 0,
                 compute_context: Callable[[], ContextManager] = contextlib.nullcontext,
                 max_consecutive_skipped_steps: int | None = None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.device = torch.device(device)
        self.temperature = float(temperature)
        self.chunk_size = chunk_size
        self.guard = StepGuard(max_consecutive_skipped_steps)  # skipped steps, over every update
        self.grad_norms: list[float] = []  # each applied step's of the last update
        self.core = UpdateCore(
            forward=self.forward, optimizers={"default_optimizer": optimizer}, settings=settings,
            loss_config=loss_config if callable(loss_config) else (lambda replay, c=loss_config: c),
            clip=ShardedClip(grad_clip), ranks=ProcessGroupRanks(self.device, lockstep=True),
            entropy_generator=seeded_generator(seed, "entropy_rng", 0),
            cov_generator=seeded_generator(seed, "cov_rng", 0), num_learners=num_learners,
            compute_context=compute_context, guard=self.guard)

    @property
    def cov_generator(self) -> torch.Generator:
        return self.core.cov_generator

    @property
    def entropy_generator(self) -> torch.Generator:
        return self.core.entropy_generator

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        from ..models.hf_policy import score_batch

        return score_batch(self.model, batch, device=self.device, temperature=self.temperature,
                           chunk_size=self.chunk_size, packed=self.core.settings.packed)

    def update(self, data: Mapping[str, Any]) -> dict[str, float]:
        """One learner update on ``data`` (a learner batch, ``recipe.batching``; numpy arrays
        or tensors, moved to the device as RLlib moves the learner's batch): the metrics the
        learner logs for it (``total_loss``, ``grad_norm`` (the mean over the applied steps; each
        step's in ``grad_norms``), ``num_optimizer_steps`` (applied), ``skipped_steps``,
        ``trained_tokens`` and the loss metrics)."""
        batch = {k: torch.as_tensor(v, device=self.device) for k, v in data.items()}
        result = self.core.update(batch)
        self.grad_norms = [n.grad_norm for n in result.step_norms if n.applied]
        out = {k: v for k, (v, _) in result.metrics.results().items()}
        out.update(total_loss=result.metrics.total_loss(), num_optimizer_steps=float(result.steps),
                   skipped_steps=float(result.skipped), trained_tokens=float(result.trained_tokens))
        if self.grad_norms:
            # the mean over the update's steps, as the learner's logger reduces it
            out["grad_norm"] = sum(self.grad_norms) / len(self.grad_norms)
        return out
