"""The learner ranks' process group, as the update and the learner state see it (no Ray).

``rank`` / ``world_size`` / ``gather_objects`` read the default ``torch.distributed`` group (the
one Ray Train forms for ``num_learners > 1``; none for a local learner). :class:`ProcessGroupRanks`
is the distributed-ops object of the update core (``core.RankOps``): the max and the "any" of a
number over the ranks, and DDP's ``no_sync``.
"""
from __future__ import annotations

import contextlib
from typing import Any, ContextManager

import torch

__all__ = ["rank", "world_size", "gather_objects", "any_rank", "ProcessGroupRanks"]


def rank() -> int:
    """This process's rank in the learners' process group (0 without one)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    """The number of learner ranks (1 without a process group)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_initialized() else 1


def gather_objects(obj: Any) -> list:
    """``obj`` of every learner rank, by rank (a collective: every rank must call it); ``[obj]``
    without a process group."""
    import torch.distributed as dist

    if world_size() == 1:
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _group_device(device: torch.device | str | None) -> torch.device | str:
    """Where a collective's tensor lives: ``device`` for an NCCL group, the CPU for gloo."""
    import torch.distributed as dist

    return device if device is not None and dist.get_backend() == "nccl" else "cpu"


def any_rank(flag: bool, device: torch.device | str | None = None) -> bool:
    """``flag`` or'ed over the ranks of the default process group (``flag`` itself without one
    or with one rank): one all-reduce of one number. ``device``: where an NCCL group wants the
    tensor (gloo takes it on the CPU)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return bool(flag)
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=_group_device(device))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


class ProcessGroupRanks:
    """``core.RankOps`` over the default process group.

    ``lockstep``: every rank must run as many forwards (FSDP, where each forward and backward is
    a collective), so :meth:`max` takes the maximum over the ranks; without it (one learner, DDP)
    each rank keeps its own count. ``ddp_module``: the DDP-wrapped module whose ``no_sync`` skips
    the gradient all-reduce on the micro-batches that do not end a step (None: nothing to skip).
    """

    def __init__(self, device: torch.device | str | None, *, lockstep: bool,
                 ddp_module: Any | None = None) -> None:
        self.device = device
        self.lockstep = bool(lockstep)
        self.ddp_module = ddp_module

    def max(self, n: int) -> int:
        import torch.distributed as dist

        if not (self.lockstep and dist.is_initialized()) or dist.get_world_size() == 1:
            return n
        t = torch.tensor([n], dtype=torch.long, device=_group_device(self.device))
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def any(self, flag: bool) -> bool:
        # every layout, DDP included: one rank's NaN loss must make every rank skip
        return any_rank(flag, self.device)

    def no_sync(self, sync: bool) -> ContextManager:
        return self.ddp_module.no_sync() if self.ddp_module is not None and not sync else contextlib.nullcontext()
