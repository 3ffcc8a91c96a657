"""Dr.BoT response and group filters (docs/algorithms.md 1.5).

A filtered response keeps its place in the group statistics; the caller sets its loss mask to 0.
The group filter keeps the groups with the largest within-group reward spread. No resampling.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence

import numpy as np

from .advantages import group_indices

__all__ = [
    "FILTER_REASONS",
    "UNREADABLE_MARKERS",
    "has_repetitive_ngram",
    "is_unreadable",
    "is_overlong",
    "response_filter_reasons",
    "group_std_filter",
]

FILTER_REASONS = ("overlong", "incomplete", "repetitive", "unreadable")

# U+FFFD plus the mojibake forms the released verl-agent reward manager also looks for
# (agent_system/reward_manager/episode.py): U+FFFD's UTF-8 bytes read as Latin-1 ("ï¿½") and the
# full-width question mark read the same way ("ï¼Ÿ"); its other entries ("ï¼�", "Ġï¿½", ...)
# contain one of these. Each is a sign of text cut or decoded inside a multi-byte character.
UNREADABLE_MARKERS = ("\ufffd", "ï¿½", "ï¼Ÿ")


def has_repetitive_ngram(token_ids: Sequence[int], n: int = 20, min_count: int = 10) -> bool:
    """True iff some n-gram of consecutive token ids occurs at least ``min_count`` times.

    n-grams overlap (positions ``i .. i+n-1`` for every ``i <= len - n``), as in the released
    ``has_repeated_ngrams``; a sequence shorter than n has none.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"has_repetitive_ngram: n must be an int >= 1, got {n!r}")
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
        raise ValueError(f"has_repetitive_ngram: min_count must be an int >= 1, got {min_count!r}")
    ids = [int(t) for t in np.asarray(token_ids).reshape(-1).tolist()]
    if len(ids) < n:
        return False
    counts = Counter(tuple(ids[i : i + n]) for i in range(len(ids) - n + 1))
    return max(counts.values()) >= min_count


def is_unreadable(text: str) -> bool:
    """True iff the decoded text contains U+FFFD or one of :data:`UNREADABLE_MARKERS`."""
    if not isinstance(text, str):
        raise ValueError(f"is_unreadable: text must be a str, got {type(text).__name__}")
    return any(marker in text for marker in UNREADABLE_MARKERS)


def is_overlong(num_response_tokens: int, max_response_tokens: int) -> bool:
    """True iff the response reached the configured maximum: ``num >= max`` (released check
    ``valid_response_length >= max_response_len``)."""
    if max_response_tokens <= 0:
        raise ValueError(f"is_overlong: max_response_tokens must be > 0, got {max_response_tokens}")
    if num_response_tokens < 0:
        raise ValueError(f"is_overlong: num_response_tokens must be >= 0, got {num_response_tokens}")
    return num_response_tokens >= max_response_tokens


def response_filter_reasons(
    token_ids: Sequence[int],
    text: str,
    *,
    reached_max_length: bool,
    has_valid_answer: bool,
    n: int = 20,
    min_count: int = 10,
) -> list[str]:
    """Reasons (subset of :data:`FILTER_REASONS`, in that order) to mask this response out.

    - overlong: ``reached_max_length``;
    - incomplete: ``not has_valid_answer`` (no valid final answer / action);
    - repetitive: :func:`has_repetitive_ngram` (n, min_count);
    - unreadable: :func:`is_unreadable`.
    """
    reasons = []
    if reached_max_length:
        reasons.append("overlong")
    if not has_valid_answer:
        reasons.append("incomplete")
    if has_repetitive_ngram(token_ids, n=n, min_count=min_count):
        reasons.append("repetitive")
    if is_unreadable(text):
        reasons.append("unreadable")
    return reasons


def group_std_filter(
    rewards: Sequence[float] | np.ndarray,
    uids: Sequence[Hashable],
    keep_fraction: float = 0.75,
) -> set[Hashable]:
    """uids of the groups to keep: the top ``k`` groups by within-group reward std.

    ``std_g = sqrt(mean_g (R - mean_g R)^2)`` (population std, ``np.std`` as in the released
    verl-agent ``_filter_rollout``, which groups by uid), and
    ``k = max(floor(keep_fraction * #groups), 1)`` (released: ``int(ratio * #groups)`` with an
    ``assert > 0``; here clamped to 1 instead of failing). Groups are ranked by std descending;
    ties keep the group whose uid appears first in the batch (the released code uses a stable
    ``sorted(..., reverse=True)`` over groups in first-appearance order).
    ``keep_fraction == 1`` keeps every group.
    """
    fn = "group_std_filter"
    if not (isinstance(keep_fraction, (int, float)) and 0 < keep_fraction <= 1):
        raise ValueError(f"{fn}: keep_fraction must be in (0, 1], got {keep_fraction!r}")
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1:
        raise ValueError(f"{fn}: rewards must be 1-D, got shape {r.shape}")
    if r.size == 0:
        raise ValueError(f"{fn}: rewards is empty")
    if not np.all(np.isfinite(r)):
        raise ValueError(f"{fn}: rewards must be finite")
    groups = group_indices(uids, len(r), fn)
    if keep_fraction == 1:
        return set(groups)
    stds = [(u, float(r[idx].std())) for u, idx in groups.items()]
    k = max(int(math.floor(keep_fraction * len(stds))), 1)
    ranked = sorted(stds, key=lambda item: item[1], reverse=True)  # stable: first uid wins ties
    return {u for u, _ in ranked[:k]}
