"""The optimizer step of one mini-batch (no Ray): the backward share of a micro-batch, the
gradient norm and clipping of the accumulated gradients, the step, and the rule that skips it.

Clipping has one implementation per layout:

* replicated (one learner, DDP; :class:`ReplicatedClip`): RLlib's own clip, in its own
  arithmetic (``ray.rllib.utils.torch_utils.clip_gradients``: per optimizer, the global norm of
  the per-tensor norms), so that a step is bitwise the step RLlib's ``postprocess_gradients`` /
  ``apply_gradients`` made; ``grad_norm`` is the L2 norm over every gradient before clipping.
* sharded (FSDP2; :class:`ShardedClip`): the global norm over every rank's shards and
  global-norm clipping of the shards (RLlib's clip works on whole tensors, not on DTensor
  shards); a non-finite norm drops the step.

Bad steps (docs/design.md "Fault tolerance"): every layout decides whether to apply a step with
one rule (``core.UpdateCore``): the step is skipped on every rank when the loss or the gradient
is non-finite on any rank (:func:`bad_step_reason`, or'ed over the ranks); :class:`StepGuard`
counts the skipped steps and stops the run after ``max_consecutive_skipped_steps`` in a row.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import torch

from ..models import sharding
from .microbatching import total_grad_norm

__all__ = ["backward_share", "StepNorms", "ReplicatedClip", "ShardedClip", "clip_sharded_grads",
           "step_optimizers", "bad_step_reason", "StepGuard", "TooManySkippedStepsError"]

#: {param: its accumulated gradient}, in the optimizers' parameter order.
Grads = Mapping[torch.Tensor, torch.Tensor]


def backward_share(loss: torch.Tensor, num_learners: int) -> None:
    """Backward of one micro-batch's loss into the accumulated ``.grad``, scaled by the learner
    count: DDP and FSDP average gradients over learners, while each learner's loss is already its
    share of the global-batch loss (global normalizers)."""
    n = int(num_learners)
    (loss * (float(n) if n > 1 else 1.0)).backward()


# ---------------------------------------------------------------------- norm and clip
@dataclass
class StepNorms:
    """What the clip of one step measured: ``grad_norm`` (the L2 norm over every gradient before
    clipping), ``optimizer_norms`` (replicated, as RLlib logs them: {optimizer name: the global
    norm its clip computed}, the ``gradients_<name>_global_norm`` metrics) and whether the step
    may be ``applied`` (False: a sharded global norm that overflowed)."""

    grad_norm: float
    optimizer_norms: dict[str, torch.Tensor] = field(default_factory=dict)
    applied: bool = True


def _rllib_global_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """RLlib's ``compute_global_norm``: the L2 norm of the per-tensor L2 norms, each overflow
    clamped (the arithmetic of RLlib's clip, kept bitwise)."""
    if not grads:
        return torch.tensor(0.0)
    norms = [torch.norm(g.detach(), 2.0).nan_to_num(neginf=-10e8, posinf=10e8) for g in grads]
    return torch.norm(torch.stack(norms), 2.0).nan_to_num(neginf=-10e8, posinf=10e8)


class ReplicatedClip:
    """Clipping of whole (replicated) gradients: ``grad_clip`` by ``grad_clip_by``
    ("global_norm", "norm" or "value"; None or 0: no clipping), per optimizer, as RLlib's
    ``Learner.postprocess_gradients_for_module`` clips them; ``log_gradients``
    (``AlgorithmConfig.log_gradients``): report each optimizer's global norm whatever the mode."""

    def __init__(self, grad_clip: float | None, grad_clip_by: str = "global_norm", *,
                 log_gradients: bool = False) -> None:
        if grad_clip_by not in ("value", "norm", "global_norm"):
            raise ValueError(f"grad_clip_by must be one of 'value', 'norm', 'global_norm', got {grad_clip_by!r}")
        self.grad_clip = grad_clip
        self.grad_clip_by = grad_clip_by
        self.log_gradients = bool(log_gradients)

    def __call__(self, optimizers: Mapping[str, torch.optim.Optimizer], grads: Grads) -> StepNorms:
        out = StepNorms(total_grad_norm(grads.values()))
        for name, optim in optimizers.items():
            mine = [(p, grads[p]) for group in optim.param_groups for p in group["params"] if p in grads]
            if self.grad_clip:
                norm = self._clip(mine)
                if self.grad_clip_by == "global_norm" or self.log_gradients:
                    out.optimizer_norms[name] = (norm if self.grad_clip_by == "global_norm"
                                                 else _rllib_global_norm([g for _, g in mine]))
            elif self.log_gradients:
                out.optimizer_norms[name] = _rllib_global_norm([g for _, g in mine])
        return out

    def _clip(self, grads: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor | None:
        """``ray.rllib.utils.torch_utils.clip_gradients`` on one optimizer's gradients; the
        global norm in "global_norm" mode."""
        clip = self.grad_clip
        if self.grad_clip_by == "value":
            for p, g in grads:
                p.grad = torch.clip(g, -clip, clip)  # RLlib's apply_gradients sets the new tensor
            return None
        if self.grad_clip_by == "norm":
            for _, g in grads:
                norm = g.norm(2).nan_to_num(neginf=-10e8, posinf=10e8)
                if norm > clip:
                    g.mul_(clip / norm)
            return None
        total = _rllib_global_norm([g for _, g in grads])
        if not grads:
            return total
        # the coefficient in [0, 1] without a host sync (RLlib's comment: no `if coeff < 1`)
        coeff = torch.clamp(clip / torch.clamp(total + 1e-6, min=clip), max=1.0)
        for _, g in grads:
            g.detach().mul_(coeff.to(g.device))
        return total


def clip_sharded_grads(grads: Grads, clip: float | None, clip_by: str = "global_norm") -> float:
    """The global L2 norm of ``grads`` ({param: grad}, FSDP shards: over every rank) before
    clipping, and global-norm clipping of the gradients to ``clip`` (None: no clipping). A
    non-finite norm clips nothing: the step is then dropped."""
    norm = sharding.global_grad_norm(grads.values())
    value = float(norm)
    if not math.isfinite(value):
        return value
    if clip is not None and clip_by == "global_norm":
        sharding.clip_grads_(list(grads), float(clip), norm)
    elif clip is not None:
        raise ValueError("sharding='fsdp' supports grad_clip_by='global_norm' only")
    return value


class ShardedClip:
    """Clipping of FSDP2 shards (:func:`clip_sharded_grads`): ``grad_clip`` (None: none) by the
    global norm over every rank's shards; a non-finite norm (finite gradients whose norm
    overflows) drops the step, the same norm on every rank: all drop it."""

    def __init__(self, grad_clip: float | None, grad_clip_by: str = "global_norm") -> None:
        self.grad_clip = grad_clip
        self.grad_clip_by = grad_clip_by

    def __call__(self, optimizers: Mapping[str, torch.optim.Optimizer], grads: Grads) -> StepNorms:
        norm = clip_sharded_grads(grads, self.grad_clip, self.grad_clip_by)
        return StepNorms(norm, applied=math.isfinite(norm))


def step_optimizers(optimizers: Iterable[torch.optim.Optimizer], apply: bool) -> None:
    """Step every optimizer on its (clipped) gradients, or, when not ``apply`` (a skipped step,
    the same on every rank), drop the gradients and leave the weights alone."""
    for optim in optimizers:
        if apply:
            optim.step()
        else:
            optim.zero_grad(set_to_none=True)


# ---------------------------------------------------------------------- bad steps
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


class TooManySkippedStepsError(RuntimeError):
    """``max_consecutive_skipped_steps`` optimizer steps in a row had a non-finite loss or
    gradient: the run stops instead of training on nothing (or on NaN weights)."""


class StepGuard:
    """Counts the skipped optimizer steps, over the whole run (not one update): ``skipped`` in
    all, ``consecutive`` since the last applied step. ``limit``
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
