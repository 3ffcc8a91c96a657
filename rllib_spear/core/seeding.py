"""Explicit random generators, so that every random choice in core (Clip-Cov's token choice,
replay sampling) is reproducible from a seed and independent of global RNG state."""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["make_generator", "make_rng", "derive_seed"]

_MASK64 = (1 << 64) - 1


def _check_seed(fn: str, seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"{fn}: seed must be an int >= 0, got {seed!r}")
    return int(seed)


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seed``."""
    g = torch.Generator(device=device)
    g.manual_seed(_check_seed("make_generator", seed))
    return g


def make_rng(seed: int) -> np.random.Generator:
    """A numpy ``Generator`` (PCG64) seeded with ``seed``."""
    return np.random.default_rng(_check_seed("make_rng", seed))


def derive_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed derived deterministically from ``seed`` and integer ``keys`` (e.g. training
    step, learner rank, micro-batch index), so parallel streams do not share random numbers."""
    base = _check_seed("derive_seed", seed)
    for i, k in enumerate(keys):
        _check_seed(f"derive_seed(keys[{i}])", k)
    ss = np.random.SeedSequence([base, *[int(k) for k in keys]])
    return int(ss.generate_state(1, dtype=np.uint64)[0]) & (_MASK64 >> 1)
