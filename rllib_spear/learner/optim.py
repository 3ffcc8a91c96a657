"""The learner's AdamW: torch's fused kernel where the parameters' device supports it.

torch's default AdamW (``foreach=None``) runs the for-loop implementation on CPU (one small
kernel chain per parameter tensor) and the multi-tensor ``foreach`` one on CUDA. The fused
implementation (one kernel over every tensor, CPU and CUDA since torch 2.4) computes the same
update, m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2, p -= lr (m_hat / (sqrt(v_hat) + eps) +
wd p), with float32 rounding differences only (tests/learner/test_optim.py: <= 1e-6
after 20 steps). Sharded (FSDP2 DTensor) parameters take the same kernels: DTensor runs the
fused (and foreach) AdamW on each rank's local shards, which matters most for CPU-offloaded
shards, where torch's default is the for-loop (its foreach default covers accelerators only).
Two gloo ranks with offloaded shards step like one unsharded default AdamW (tests/models/test_cpu_offload.py). The
CPU kernels run on torch's intra-op threads: a learner's ``num_cpus_per_learner``
(models/threads.py).
"""
from __future__ import annotations

from typing import Iterable

import torch

__all__ = ["build_adamw", "adamw_implementation"]

#: Implementations tried in order; the first torch accepts for the parameters is used.
_IMPLEMENTATIONS: tuple[tuple[str, dict], ...] = (("fused", {"fused": True}), ("foreach", {"foreach": True}))


def build_adamw(params: Iterable[torch.nn.Parameter], *, lr: float, betas: tuple[float, float],
                weight_decay: float, sharded: bool = False) -> torch.optim.AdamW:
    """AdamW over ``params``: fused when torch supports it on their device (CPU included),
    else foreach, else the default. ``sharded`` (FSDP2 DTensor shards, offloaded or not) takes
    the same order (see the module docstring); the flag is kept for the callers."""
    params = list(params)
    common = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay)
    if not params:
        return torch.optim.AdamW(params, **common)
    for _, kwargs in _IMPLEMENTATIONS:
        try:
            return torch.optim.AdamW(params, **common, **kwargs)
        except (RuntimeError, ValueError):
            # torch refuses the implementation up front for unsupported devices / dtypes
            continue
    return torch.optim.AdamW(params, **common)


def adamw_implementation(optimizer: torch.optim.Optimizer) -> str:
    """"fused", "foreach" or "default": which AdamW implementation ``optimizer`` runs."""
    d = optimizer.defaults
    if d.get("fused"):
        return "fused"
    if d.get("foreach"):
        return "foreach"
    return "default"
