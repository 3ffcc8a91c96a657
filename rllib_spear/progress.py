"""The one-line summary of a training iteration, as ``rllib-spear train`` prints it.

``progress_line(result)`` reads an RLlib result dict (``algo.train()``'s, or a Tune trial's) and
writes ``iter   3 | reward 0.250 | success 0.250 | tool_rate 0.875 | ... | time 41.2s``, plus a
warning when the response filters masked (nearly) the whole batch. The CLI prints it for every
result; ``.debugging(print_summary=True)`` makes ``algo.train()`` print it too. Pure Python.
"""
from __future__ import annotations

from typing import Any

__all__ = ["PROGRESS_KEYS", "progress_line"]

#: (label, path in the result dict) of every figure the line shows, when the result has it.
PROGRESS_KEYS = (
    ("reward", ("env_runners", "reward_total_mean")),
    ("success", ("env_runners", "success_rate")),
    ("f1", ("env_runners", "f1_mean")),
    ("tool_rate", ("env_runners", "tool_call_rate")),
    ("turns", ("env_runners", "turns_mean")),
    ("resp_len", ("env_runners", "response_length_mean")),
    ("sil_w", ("spear", "sil_weight")),
    ("tool_w", ("spear", "tool_reward_weight")),
    ("replayed", ("spear", "sil_replayed_samples")),
    ("filtered", ("filters", "any_frac")),
)


def progress_line(result: dict[str, Any]) -> str:
    """The iteration's summary line (module docstring)."""
    parts = [f"iter {result.get('training_iteration', '?'):>3}"]
    for label, path in PROGRESS_KEYS:
        node: Any = result
        for p in path:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, (int, float)):
            parts.append(f"{label} {node:.3f}")
    parts.append(f"time {result.get('time_this_iter_s', 0.0):.1f}s")
    filters = result.get("filters") if isinstance(result.get("filters"), dict) else {}
    if filters.get("nearly_all_filtered"):
        # the run's log says once which filter and which knob (recipe/filters.py)
        parts.append(f"WARNING: the filters masked {filters.get('any_frac', 1.0):.0%} of the batch, "
                     "nothing trains (see the warning above)")
    return " | ".join(parts)
