"""Step schedules: SPEAR's tool-reward curriculum and SIL weight (docs/algorithms.md 2.1, 2.3), the tool-call
bonus and SPADER's tool-cost ramp (3.2).

``step`` is the global training step t (iteration), starting at 1 (the notation of
docs/algorithms.md).
"""
from __future__ import annotations

import math

__all__ = [
    "TOOL_REWARD_SCHEDULES",
    "tool_reward_weight",
    "tool_call_bonus",
    "sil_weight",
    "spader_tool_cost",
]

TOOL_REWARD_SCHEDULES = ("none", "constant", "cosine")


def _int_arg(fn: str, name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{fn}: {name} must be an int >= {minimum}, got {value!r}")
    return value


def _num_arg(fn: str, name: str, value: float, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < minimum:
        raise ValueError(f"{fn}: {name} must be a finite number >= {minimum}, got {value!r}")
    return float(value)


def tool_reward_weight(step: int, schedule: str = "cosine", total_steps: int = 200) -> float:
    """lambda_tool(t) of the intrinsic tool-call reward (docs/algorithms.md 2.1).

    - ``none``: 0;  ``constant``: 1;
    - ``cosine``: ``(1 + cos(pi * t / T)) / 2`` for ``t <= T``, 0 afterwards (T = total_steps).
    """
    fn = "tool_reward_weight"
    _int_arg(fn, "step", step, 0)
    _int_arg(fn, "total_steps", total_steps, 1)
    if schedule == "none":
        return 0.0
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        if step > total_steps:
            return 0.0
        # max(0, .) as released: cos rounding can give -1e-17 at t = T.
        return max(0.0, (1.0 + math.cos(math.pi * step / total_steps)) / 2.0)
    raise ValueError(f"{fn}: schedule must be one of {TOOL_REWARD_SCHEDULES}, got {schedule!r}")


def tool_call_bonus(num_tool_calls: int, per_call: float = 0.1, cap: float = 1.0) -> float:
    """r_tool = ``min(per_call * N_tool, cap)`` (docs/algorithms.md 2.1: ``min(0.1 N, 1.0)``)."""
    fn = "tool_call_bonus"
    _int_arg(fn, "num_tool_calls", num_tool_calls, 0)
    per_call = _num_arg(fn, "per_call", per_call)
    cap = _num_arg(fn, "cap", cap)
    return min(per_call * num_tool_calls, cap)


def sil_weight(step: int, kappa: float = 1.0, total_steps: int = 200) -> float:
    """w_SIL(t) = ``kappa * (1 - cos(pi * t / T)) / 2`` for ``t <= T``, kappa afterwards (docs/algorithms.md 2.3)."""
    fn = "sil_weight"
    _int_arg(fn, "step", step, 0)
    kappa = _num_arg(fn, "kappa", kappa)
    _int_arg(fn, "total_steps", total_steps, 1)
    if step > total_steps:
        return kappa
    return kappa * (1.0 - math.cos(math.pi * step / total_steps)) / 2.0


def spader_tool_cost(step: int, cost: float = 0.01, free_steps: int = 100,
                     rampup_steps: int = 100) -> float:
    """Per-query tool cost c(t) of SPADER (docs/algorithms.md 3.2), as released (``_get_effective_cost``):

    - ``t < free_steps``: 0;
    - ``free_steps <= t < free_steps + rampup_steps``: ``cost * (t - free_steps) / rampup_steps``
      (so c(free_steps) = 0 and the ramp reaches ``cost`` at ``free_steps + rampup_steps``);
    - otherwise ``cost``. ``rampup_steps = 0`` gives the full cost from ``free_steps`` on.
    """
    fn = "spader_tool_cost"
    _int_arg(fn, "step", step, 0)
    cost = _num_arg(fn, "cost", cost)
    _int_arg(fn, "free_steps", free_steps, 0)
    _int_arg(fn, "rampup_steps", rampup_steps, 0)
    if step < free_steps:
        return 0.0
    elapsed = step - free_steps
    if rampup_steps > 0 and elapsed < rampup_steps:
        return cost * elapsed / rampup_steps
    return cost
