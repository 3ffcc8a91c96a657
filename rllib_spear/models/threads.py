"""torch's CPU thread count in a Ray actor.

Ray starts every actor with ``OMP_NUM_THREADS`` = its ``num_cpus`` (1 by default), so torch in a
learner or env runner uses one core even on an otherwise idle machine. In this workload sampling
and learning alternate (the driver waits for one before starting the other), so on a CPU-only
machine each phase may use every core without oversubscribing them.

A remote learner's threads are the CPUs Ray reserves for it (``num_cpus_per_learner``,
``learner_torch_threads``): Ray sets ``OMP_NUM_THREADS`` from them only when the variable is not
set already (a cluster's ``OMP_NUM_THREADS=1`` wins), and a CPU-offloaded FSDP learner runs its
whole AdamW step on the CPU (docs/design.md "Learner sharding"). GPU learners with
``num_cpus_per_learner="auto"`` reserve no CPU and keep one thread (``validate()`` warns when they
offload).
"""
from __future__ import annotations

import math
from typing import Any

__all__ = ["apply_torch_threads", "learner_torch_threads"]


def apply_torch_threads(num_threads: int | None) -> int:
    """Set torch's intra-op threads to ``num_threads`` (config ``torch_num_threads``, checked by
    ``validate()``); ``None`` leaves torch as Ray started it. Returns the resulting count."""
    import torch

    if num_threads is not None:
        torch.set_num_threads(int(num_threads))
    return torch.get_num_threads()


def learner_torch_threads(torch_num_threads: int | None, num_cpus_per_learner: Any, num_learners: int) -> int | None:
    """The intra-op thread count of a learner: ``torch_num_threads`` when set, else, for remote
    learners (``num_learners >= 1``), the whole CPUs reserved per learner (floor of
    ``num_cpus_per_learner``, as Ray's ``OMP_NUM_THREADS``); None (leave torch as it is) for the
    local learner, "auto" or less than one CPU."""
    if torch_num_threads is not None:
        return int(torch_num_threads)
    if int(num_learners or 0) < 1 or isinstance(num_cpus_per_learner, (str, bool)) or num_cpus_per_learner is None:
        return None
    n = math.floor(float(num_cpus_per_learner))
    return n if n >= 1 else None
