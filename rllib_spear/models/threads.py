"""torch's CPU thread count in a Ray actor.

Ray starts every actor with ``OMP_NUM_THREADS`` = its ``num_cpus`` (1 by default), so torch in a
learner or env runner uses one core even on an otherwise idle machine. In this workload sampling
and learning alternate (the driver waits for one before starting the other), so on a CPU-only
machine each phase may use every core without oversubscribing them.
"""
from __future__ import annotations

__all__ = ["apply_torch_threads"]


def apply_torch_threads(num_threads: int | None) -> int:
    """Set torch's intra-op threads to ``num_threads`` (config ``torch_num_threads``, checked by
    ``validate()``); ``None`` leaves torch as Ray started it. Returns the resulting count."""
    import torch

    if num_threads is not None:
        torch.set_num_threads(int(num_threads))
    return torch.get_num_threads()
