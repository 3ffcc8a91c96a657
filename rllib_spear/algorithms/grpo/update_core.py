"""The update core of the GRPO learner, without RLlib: the epoch / mini-batch / micro-batch loop,
the policy loss of a micro-batch, the backward pass, the global gradient norm and clipping of
sharded (FSDP2) gradients, and the optimizer step.

``GRPOTorchLearner`` (learner.py) runs its update through these functions: it passes itself as
the :class:`UpdateHooks` of :func:`run_update` (its hooks are RLlib's ``compute_losses`` /
``compute_gradients`` / ``postprocess_gradients`` / ``apply_gradients``, which in turn call
:func:`policy_loss_parts`, :func:`backward_share`, :func:`clip_sharded_grads` and
:func:`step_optimizers`). :class:`LocalUpdate` is the same update for one process and no RLlib:
a model, its optimizer and the loss configs; benchmarks/gpu_learner_check.py trains through it on
a machine without Ray, and tests/algorithms/test_update_core.py checks that it moves the weights
as the RLlib learner does.

Bad steps (docs/design.md "Fault tolerance"): every layout (one learner, DDP, FSDP2) decides
whether to apply an optimizer step through :func:`step_or_skip`, one rule: the step is skipped
on every rank when the loss or the gradient is non-finite on any rank; :class:`StepGuard` counts
the skipped steps and stops the run after ``max_consecutive_skipped_steps`` in a row.

Nothing here imports Ray (tests/algorithms/test_update_core.py imports it with Ray blocked).
"""
from __future__ import annotations

import contextlib
import logging
import math
from typing import Any, Callable, ContextManager, Iterable, Mapping, Protocol

import torch

from ...core.losses import LossNormalizer, PolicyLossConfig, policy_loss
from ...models import sharding
from .microbatching import (
    LossMetrics,
    dummy_rows,
    entropy_metric_sample,
    epoch_view,
    num_epochs_of,
    slice_rows,
    token_budget_microbatches,
)

logger = logging.getLogger(__name__)

__all__ = ["UpdateHooks", "UpdateSettings", "run_update", "minibatch_step", "recompute_old_logp",
           "policy_loss_parts", "backward_share", "clip_sharded_grads", "step_optimizers",
           "record_engine_mismatch", "add_entropy_sample", "LocalUpdate", "StepGuard",
           "TooManySkippedStepsError", "step_or_skip", "bad_step_reason", "any_rank"]


class UpdateHooks(Protocol):
    """What :func:`run_update` needs from a learner (``GRPOTorchLearner``, :class:`LocalUpdate`)."""

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        """The module's forward pass on a micro-batch (``models.hf_policy.score_batch``)."""

    def compute_context(self) -> ContextManager:
        """Where forwards run: bf16 autocast on a replicated learner under mixed precision."""

    def losses(self, batch: dict, fwd_out: dict) -> dict[Any, torch.Tensor]:
        """{module id: this micro-batch's loss} (its metrics go to ``metrics``)."""

    def backward(self, losses: dict[Any, torch.Tensor]) -> dict:
        """Backward into the accumulated ``.grad``; returns {param ref: grad}."""

    def finish_step(self, grads: dict) -> bool | None:
        """Norm, clip and optimizer step of one mini-batch's accumulated gradients (finite on
        every rank: :func:`step_or_skip`). False: the step was dropped after all (FSDP: a global
        norm that overflows), the same on every rank."""

    def zero_grad(self) -> None: ...

    def max_over_ranks(self, n: int) -> int:
        """max(n) over the learner ranks (FSDP: every rank runs as many forwards)."""

    def any_over_ranks(self, flag: bool) -> bool:
        """``flag`` or'ed over every learner rank, in any layout (:func:`any_rank`)."""

    def no_sync(self, sync: bool) -> ContextManager:
        """DDP's ``no_sync`` on micro-batches that do not end the step (``sync`` False)."""


class UpdateSettings:
    """The knobs of one update, read from a learner config (``GRPOConfig`` or any object with its
    attribute names): token budget, entropy bonus / metric sample, TIS, logp_old recomputation."""

    def __init__(self, *, micro_batch_token_budget: int, entropy_coeff: float = 0.0,
                 entropy_metric_tokens: int = 1024, tis: bool = False,
                 recompute_old_logprobs: bool = False) -> None:
        self.budget = int(micro_batch_token_budget)
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
                   recompute_old_logprobs=bool(getattr(config, "recompute_old_logprobs", False)))


# ---------------------------------------------------------------------- the loss
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
                      loss_config: Callable[[bool], PolicyLossConfig], ref_logp: torch.Tensor | None = None,
                      generator: torch.Generator | None = None,
                      loss_fn: Callable = policy_loss) -> tuple[torch.Tensor, list[tuple[str, dict]]]:
    """A micro-batch's loss: ``sum over parts of loss_weight x policy_loss(part)``, each part
    (on-policy, replayed) with its own loss config (``loss_config(replay)``) and global
    normalizer (the batch's ``norm_num_tokens`` / ``norm_num_seqs`` / ``t_norm`` columns).
    Returns (the loss, [(metric prefix, the part's metrics)]). ``loss_fn``: ``policy_loss``
    (the learner passes the name it holds, which tests replace)."""
    logp = fwd_out["logp"]
    entropy = fwd_out.get("entropy")
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
        loss, metrics = loss_fn(
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


# ---------------------------------------------------------------------- gradients and step
def backward_share(losses: Iterable[torch.Tensor], num_learners: int) -> None:
    """Backward of one micro-batch's loss into the accumulated ``.grad``, scaled by the learner
    count: DDP and FSDP average gradients over learners, while each learner's loss is already its
    share of the global-batch loss (global normalizers)."""
    losses = list(losses)
    total = losses[0]
    for loss in losses[1:]:
        total = total + loss
    n = int(num_learners)
    (total * (float(n) if n > 1 else 1.0)).backward()


def clip_sharded_grads(grads: Mapping[torch.Tensor, torch.Tensor], clip: float | None,
                       clip_by: str = "global_norm") -> float:
    """The global L2 norm of ``grads`` ({param: grad}, FSDP shards: over every rank) before
    clipping, and global-norm clipping of the gradients to ``clip`` (None: no clipping). A
    non-finite norm clips nothing: :func:`step_optimizers` then skips the step."""
    norm = sharding.global_grad_norm(grads.values())
    value = float(norm)
    if not math.isfinite(value):
        return value
    if clip is not None and clip_by == "global_norm":
        sharding.clip_grads_(list(grads), float(clip), norm)
    elif clip is not None:
        raise ValueError("sharding='fsdp' supports grad_clip_by='global_norm' only")
    return value


def step_optimizers(optimizers: Iterable[torch.optim.Optimizer], apply: bool) -> None:
    """Step every optimizer on its (clipped) gradients, or, when not ``apply`` (a non-finite
    gradient norm, the same on every rank), drop the gradients and leave the weights alone."""
    for optim in optimizers:
        if apply:
            optim.step()
        else:
            optim.zero_grad(set_to_none=True)


# ---------------------------------------------------------------------- bad steps
class TooManySkippedStepsError(RuntimeError):
    """``max_consecutive_skipped_steps`` optimizer steps in a row had a non-finite loss or
    gradient: the run stops instead of training on nothing (or on NaN weights)."""


class StepGuard:
    """Counts the optimizer steps :func:`step_or_skip` skipped, over the whole run (not one
    update): ``skipped`` in all, ``consecutive`` since the last applied step. ``limit``
    (``training(max_consecutive_skipped_steps=...)``): that many skipped steps in a row raise
    :class:`TooManySkippedStepsError`; 0 or None never stop. The decision is the same on every
    rank, so every rank's guard raises at the same step (no rank is left waiting in a
    collective)."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = int(limit or 0)
        self.skipped = 0
        self.consecutive = 0

    def get_state(self) -> dict[str, int]:
        """The counters, for the learner's checkpoint: a restored run goes on counting (a run of
        skipped steps that spans a restart still stops at ``limit``)."""
        return {"skipped": self.skipped, "consecutive": self.consecutive}

    def set_state(self, state: dict[str, int]) -> None:
        self.skipped, self.consecutive = int(state["skipped"]), int(state["consecutive"])

    def record(self, applied: bool) -> None:
        """One optimizer step's outcome; raises when it makes ``limit`` skipped steps in a row."""
        if applied:
            self.consecutive = 0
            return
        self.skipped += 1
        self.consecutive += 1
        if self.limit and self.consecutive >= self.limit:
            raise TooManySkippedStepsError(
                f"{self.consecutive} optimizer steps in a row were skipped for a non-finite loss or gradient "
                f"(training(max_consecutive_skipped_steps={self.limit})): the run has diverged or its batches "
                f"hold NaN/inf (rewards, advantages, engine log-probs). Lower `lr` or `grad_clip`, check the "
                f"reward functions and the engine's log-probs (recompute_old_logprobs=True scores them on the "
                f"trainer), or raise max_consecutive_skipped_steps (0 or None: never stop); "
                f"{self.skipped} steps skipped in all")


def any_rank(flag: bool, device: torch.device | str | None = None) -> bool:
    """``flag`` or'ed over the ranks of the default process group (``flag`` itself without one
    or with one rank): one all-reduce of one number. ``device``: where an NCCL group wants the
    tensor (gloo takes it on the CPU)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return bool(flag)
    on = device if device is not None and dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=on)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def bad_step_reason(loss_finite: bool, grads: Iterable[torch.Tensor | None]) -> str | None:
    """Why this rank's step must not be applied: "non-finite loss", "non-finite gradient", or
    None. The gradients are this rank's (FSDP: its local shards; DDP: already all-reduced); a
    gradient whose L2 norm overflows counts as non-finite (its clipping coefficient would be 0).
    One host sync over all gradients (torch's foreach norm)."""
    if not loss_finite:
        return "non-finite loss"
    from torch.distributed.tensor import DTensor

    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads if g is not None]
    if local and not bool(torch.isfinite(torch.nn.utils.get_total_norm([g.detach() for g in local]))):
        return "non-finite gradient"
    return None


def step_or_skip(hooks: UpdateHooks, grads: dict, loss_finite: bool) -> bool:
    """The optimizer step of one mini-batch, or its skip: the rule of every layout. The step is
    skipped on every rank when the loss or the gradient is non-finite on any rank (a flag
    all-reduced over the ranks: DDP all-reduces the gradients but not the loss, and a rank that
    stepped while another skipped would hold other weights from then on). Skipping drops the
    gradients: no weight and no optimizer state changes. Returns whether the step was applied."""
    reason = bad_step_reason(loss_finite, grads.values())
    if hooks.any_over_ranks(reason is not None):
        logger.warning("skipping this optimizer step: %s", reason or "a non-finite loss or gradient on another rank")
        hooks.zero_grad()
        return False
    return hooks.finish_step(grads) is not False


# ---------------------------------------------------------------------- the loop
def recompute_old_logp(hooks: UpdateHooks, data: dict, budget: int) -> torch.Tensor:
    """logp_old of the on-policy rows under the current weights (no grad), micro-batched like
    the update. Replayed (SIL) rows keep their stored behaviour log-probs: their ratio is
    pi_theta / pi_behaviour (docs/algorithms.md 2.3), and the current weights are not the
    policy that generated them."""
    out = data["old_logp"].clone()
    on_policy = torch.nonzero(data["is_replay"] == 0).flatten()
    parts = [on_policy[p] for p in token_budget_microbatches(data["attention_mask"][on_policy], budget)]
    # FSDP: every rank runs the same number of forwards (the others score a dummy row).
    parts = parts + [None] * (hooks.max_over_ranks(len(parts)) - len(parts))
    with torch.no_grad(), hooks.compute_context():
        for part in parts:
            sub = dummy_rows(data) if part is None else slice_rows(data, part)
            sub["_need_entropy"] = False
            sub["_score_mask"] = sub["loss_mask"] > 0
            logp = hooks.forward(sub)["logp"]
            if part is not None:
                logp = logp.detach().float()
                out[part, :logp.shape[1]] = logp * sub["loss_mask"]
    return out


def minibatch_step(hooks: UpdateHooks, data: dict, mb: int, settings: UpdateSettings, *,
                   metrics: LossMetrics, entropy_generator: torch.Generator,
                   first: bool, guard: StepGuard | None = None) -> tuple[dict, int]:
    """One optimizer step on mini-batch ``mb`` of ``data`` (one epoch's view,
    ``microbatching.epoch_view``): gradients accumulated over its token-budget micro-batches,
    applied or skipped by :func:`step_or_skip` and recorded in ``guard`` (which may raise
    :class:`TooManySkippedStepsError`). ``first``: the update's first step (entropy sample,
    engine mismatch). Returns (the last micro-batch's forward outputs, the tokens trained on)."""
    rows = torch.nonzero(data["minibatch_id"].long() == mb).flatten()
    micro = token_budget_microbatches(data["attention_mask"][rows], settings.budget)
    # A learner without rows of this mini-batch joins the collectives with dummy rows;
    # under FSDP every forward is a collective, so every rank runs as many micro-batches.
    n_micro = hooks.max_over_ranks(max(len(micro), 1))
    micro = micro + [None] * (n_micro - len(micro))
    # Entropy on every micro-batch only when the bonus needs it (with its gradient); else a
    # bounded uniform sample of the first mini-batch's loss tokens, detached, for the metric.
    sampled = first and not settings.entropy_always and settings.metric_tokens > 0
    if sampled:
        data = dict(data)
        pick = torch.zeros_like(data["loss_mask"], dtype=torch.bool)
        pick[rows] = entropy_metric_sample(data["loss_mask"][rows], settings.metric_tokens, entropy_generator)
        data["entropy_metric_mask"] = pick
    # with TIS the loss measures the engine mismatch on every token (record_engine_mismatch)
    mismatch = first and not settings.tis
    sums = {False: [0.0, 0], True: [0.0, 0]}  # part (replay?) -> [entropy sum, tokens]
    fwd_out: dict = {}
    grads: dict = {}
    trained_tokens = 0
    loss_finite = True
    hooks.zero_grad()
    for i, part in enumerate(micro):
        with hooks.no_sync(i == len(micro) - 1):  # DDP: one all-reduce per optimizer step
            sub = dummy_rows(data) if part is None else slice_rows(data, rows[part])
            sub["_need_entropy"] = settings.entropy_always
            # only the loss tokens go through the output head (models/logprobs.py)
            sub["_score_mask"] = sub["loss_mask"] > 0
            pick = sub.pop("entropy_metric_mask", None)
            if sampled:
                sub["_entropy_mask"] = pick
            with hooks.compute_context():
                fwd_out = hooks.forward(sub)
            fwd_out = {k: v.float() for k, v in fwd_out.items()}
            if sampled and part is not None:
                add_entropy_sample(sums, fwd_out["entropy_sample"], pick, sub["is_replay"])
            # a dummy row's metrics are not the batch's: it records none
            metrics.recording = part is not None
            losses = hooks.losses(sub, fwd_out)
            metrics.recording = True
            if part is None:
                losses = {mid: loss * 0.0 for mid, loss in losses.items()}
            else:
                share = float(sum(float(v.detach()) for v in losses.values()))
                loss_finite = loss_finite and math.isfinite(share)
                metrics.add_share(LossMetrics.TOTAL, share)
                trained_tokens += int(sub["attention_mask"].sum())
                if mismatch:
                    record_engine_mismatch(metrics, sub, fwd_out)
            grads = hooks.backward(losses)
    for replay, (total, count) in sums.items():
        metrics.add_token_mean(("sil_" if replay else "") + "entropy", total / max(count, 1), count)
    (guard or StepGuard()).record(step_or_skip(hooks, grads, loss_finite))
    return fwd_out, trained_tokens


def run_update(hooks: UpdateHooks, data: dict, settings: UpdateSettings, *, metrics: LossMetrics,
               entropy_generator: torch.Generator,
               recompute: Callable[[dict, int], torch.Tensor] | None = None,
               guard: StepGuard | None = None) -> tuple[dict, int, int]:
    """``num_epochs`` passes (the width of ``minibatch_id``) over a learner batch
    (``recipe.batching.build_learner_batches``), each one optimizer step per mini-batch of that
    epoch's shuffle: ``num_epochs x num_minibatches`` steps. With TIS or
    ``recompute_old_logprobs`` logp_old is recomputed once, before the first step (every
    epoch's ratio is against the policy before the update, PPO). Returns (the last forward
    outputs, the tokens trained on, the optimizer steps applied: the skipped ones are counted in
    ``guard``, a run-long :class:`StepGuard`). ``recompute(data, budget)``: how logp_old is
    recomputed (default :func:`recompute_old_logp` on ``hooks``)."""
    guard = guard if guard is not None else StepGuard()
    skipped_before = guard.skipped
    num_epochs = num_epochs_of(data)
    num_minibatches = int(data["num_minibatches"][0]) if len(data["input_ids"]) else 0
    if settings.recompute_old_logprobs or settings.tis:
        # Trainer-side logp_old (1.6): the ratio is taken against the trainer's numerics and
        # the engine log-probs only enter the truncated importance weight.
        data = dict(data)
        if recompute is None:
            data["old_logp"] = recompute_old_logp(hooks, epoch_view(data, 0), settings.budget)
        else:
            data["old_logp"] = recompute(epoch_view(data, 0), settings.budget)
    fwd_out: dict = {}
    trained_tokens = 0
    for epoch in range(num_epochs):
        view = epoch_view(data, epoch)
        for mb in range(num_minibatches):
            metrics.step = (epoch, mb)
            fwd_out, tokens = minibatch_step(hooks, view, mb, settings, metrics=metrics,
                                             entropy_generator=entropy_generator,
                                             first=epoch == 0 and mb == 0, guard=guard)
            trained_tokens += tokens
    return fwd_out, trained_tokens, num_epochs * num_minibatches - (guard.skipped - skipped_before)


# ---------------------------------------------------------------------- one process, no RLlib
class LocalUpdate:
    """The learner's update for one process and no RLlib: ``model`` (an HF causal LM, plain or
    FSDP2-sharded with ``models.sharding.shard_causal_lm``), its ``optimizer``
    (``learner_optim.build_adamw``) and the loss configs. Under a process group of several ranks
    every rank calls :meth:`update` on its own rows (FSDP: the gradients are reduce-scattered;
    the loss scale and clipping are the sharded learner's).

    Clipping: the global norm over every parameter's gradient (``models.sharding``), as the
    learner clips under FSDP; replicated, RLlib's clip computes the same norm (to float
    rounding) and so the same step.
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
        self._loss_config = loss_config if callable(loss_config) else (lambda replay, c=loss_config: c)
        self.settings = settings
        self.device = torch.device(device)
        self.temperature = float(temperature)
        self.chunk_size = chunk_size
        self.grad_clip = grad_clip
        self.num_learners = int(num_learners)
        self._context = compute_context
        # the learner's streams (learner_state.RNG_STREAMS offsets, rank 0)
        self.cov_generator = torch.Generator().manual_seed(int(seed) + 7919)
        self.entropy_generator = torch.Generator().manual_seed(int(seed) + 104729)
        self.metrics = LossMetrics()
        self.grad_norms: list[float] = []
        self.guard = StepGuard(max_consecutive_skipped_steps)  # skipped steps, over every update

    # hooks
    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        from ...models.hf_policy import score_batch

        return score_batch(self.model, batch, device=self.device, temperature=self.temperature,
                           chunk_size=self.chunk_size)

    def compute_context(self) -> ContextManager:
        return self._context()

    def losses(self, batch: dict, fwd_out: dict) -> dict[Any, torch.Tensor]:
        loss, parts = policy_loss_parts(batch, fwd_out, loss_config=self._loss_config,
                                        generator=self.cov_generator)
        if self.metrics.recording:
            for prefix, m in parts:
                self.metrics.add(m, prefix)
        return {"default_policy": loss}

    def backward(self, losses: dict[Any, torch.Tensor]) -> dict:
        backward_share(losses.values(), self.num_learners)
        return {p: p.grad for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None}

    def finish_step(self, grads: dict) -> bool:
        norm = clip_sharded_grads(grads, self.grad_clip)
        ok = math.isfinite(norm)  # finite gradients whose global norm overflows: dropped too
        if ok:
            self.grad_norms.append(norm)
        else:
            logger.warning("grad_norm is %s: skipping this optimizer step", norm)
        step_optimizers([self.optimizer], ok)
        return ok

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def max_over_ranks(self, n: int) -> int:
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_world_size() == 1:
            return n
        t = torch.tensor([n], dtype=torch.long, device=self.device if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def any_over_ranks(self, flag: bool) -> bool:
        return any_rank(flag, self.device)

    def no_sync(self, sync: bool) -> ContextManager:
        return contextlib.nullcontext()

    # the update
    def update(self, data: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """One learner update on ``data`` (a learner batch, ``recipe.batching``; numpy arrays
        or tensors, moved to the device as RLlib moves the learner's batch): the metrics the
        learner logs for it (``total_loss``, ``grad_norm`` (the mean over the applied steps; each
        step's in ``grad_norms``), ``num_optimizer_steps`` (applied), ``skipped_steps``
        (:func:`step_or_skip`), ``trained_tokens`` and the loss metrics)."""
        self.metrics = LossMetrics()
        self.grad_norms = []
        batch = {k: torch.as_tensor(v, device=self.device) for k, v in data.items()}
        skipped_before = self.guard.skipped
        _, tokens, steps = run_update(self, batch, self.settings, metrics=self.metrics,
                                      entropy_generator=self.entropy_generator, guard=self.guard)
        out = {k: v for k, (v, _) in self.metrics.results().items()}
        out.update(total_loss=self.metrics.total_loss(), num_optimizer_steps=float(steps),
                   skipped_steps=float(self.guard.skipped - skipped_before), trained_tokens=float(tokens))
        if self.grad_norms:
            # the mean over the update's steps, as the learner's logger reduces it
            out["grad_norm"] = sum(self.grad_norms) / len(self.grad_norms)
        return out
