"""Response filters (Dr.BoT, docs/algorithms.md 1.5), selected by ``response_filters``.

A filtered response keeps its place in the group statistics (its reward still counts in its
group's baseline); its loss mask becomes 0. A filter is ``fn(traj, cfg) -> bool`` (True = mask
it out). The group filter (``group_filter_keep_fraction``) keeps the groups with the largest
reward spread. Add a filter with::

    @register_response_filter("too_short")
    def too_short(traj, cfg) -> bool: return traj.num_generated_tokens < 4

and select it with ``.training(response_filters=("overlong", "too_short"))``.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..core.filters import group_std_filter, has_repetitive_ngram, is_unreadable
from ..core.trajectory import Trajectory
from ..registry import Registry
from .piece import ErrorFn, Piece, check_choice, check_ints, piece_decorator

__all__ = ["RESPONSE_FILTERS", "register_response_filter", "FilterResult", "apply_filters", "DRBOT_FILTERS",
           "OVERLONG_SCOPES"]

RESPONSE_FILTERS: Registry[Piece] = Registry(
    "response filter", register_hint="rllib_spear.recipe.register_response_filter")

#: Dr.BoT's four response filters, in the order of 1.5.
DRBOT_FILTERS = ("overlong", "incomplete", "repetitive", "unreadable")


def register_response_filter(name: str, *, defaults: dict[str, Any] | None = None,
                             validate: Callable[[Any, ErrorFn], None] | None = None,
                             override: bool = False) -> Callable:
    """Decorator: register ``fn(traj: Trajectory, cfg) -> bool`` (True = mask the response out)."""
    return piece_decorator(RESPONSE_FILTERS, name, defaults=defaults, validate=validate, override=override)


#: ``overlong_scope`` values: what "overlong" means for a multi-turn episode.
OVERLONG_SCOPES = ("episode", "turn")


def _check_overlong(cfg: Any, err: ErrorFn) -> None:
    check_choice(cfg, err, "overlong_scope", OVERLONG_SCOPES)


@register_response_filter("overlong", defaults={"overlong_scope": "episode"}, validate=_check_overlong)
def overlong(traj: Trajectory, cfg: Any) -> bool:
    """The response ran into a token budget before it ended.

    ``overlong_scope="episode"``: the episode reached ``max_response_tokens`` (or the context):
    the released check on one-sample episodes (SPEAR's ReTool recipe: ``valid_response_length >=
    max_response_length``). ``"turn"``: also when any turn was stopped at its token cap
    (``RolloutRecord.turn_hit_cap``): the released agent code (verl-agent) makes every turn a
    sample and masks one that reached ``max_response_length`` (512 tokens per turn), so here a
    turn that reached ``max_new_tokens`` trips it. Our episode is one sequence, so the whole
    episode is masked, not only that turn (docs/recipes.md, "Token budgets").
    """
    if traj.rollout.reached_max_length:
        return True
    return cfg.overlong_scope == "turn" and any(traj.rollout.turn_hit_cap)


@register_response_filter("incomplete")
def incomplete(traj: Trajectory, cfg: Any) -> bool:
    """No valid final answer / action (``EpisodeStats.has_answer`` is False)."""
    return not traj.require_stats("incomplete filter").has_answer


def _check_ngram(cfg: Any, err: ErrorFn) -> None:
    check_ints(cfg, err, ("filter_ngram_size", "filter_ngram_repeats"), 1)


@register_response_filter("repetitive", defaults={"filter_ngram_size": 20, "filter_ngram_repeats": 10},
                          validate=_check_ngram)
def repetitive(traj: Trajectory, cfg: Any) -> bool:
    """An n-gram of the generated tokens repeats ``filter_ngram_repeats`` times or more."""
    ids = [tok for seg in traj.assistant_token_ids() for tok in seg]
    return has_repetitive_ngram(ids, n=cfg.filter_ngram_size, min_count=cfg.filter_ngram_repeats)


@register_response_filter("unreadable")
def unreadable(traj: Trajectory, cfg: Any) -> bool:
    """The decoded text holds replacement characters / mojibake."""
    return is_unreadable("".join(traj.rollout.assistant_texts))


@dataclass
class FilterResult:
    """``masks``: the loss mask of each trajectory (zeros when filtered); ``filtered``: whether
    it was; ``fractions``: per reason (and ``any``), the share of the batch it masked."""

    masks: list[np.ndarray]
    filtered: list[bool]
    fractions: dict[str, float]


def apply_filters(trajs: list[Trajectory], cfg: Any) -> FilterResult:
    """Run ``cfg.response_filters`` (in order) and the group-std filter on the batch."""
    filters = [(name, RESPONSE_FILTERS.get(name)) for name in cfg.response_filters]
    kept_groups = None
    if cfg.group_filter_keep_fraction is not None:
        kept_groups = group_std_filter([t.total_reward for t in trajs], [t.uid for t in trajs],
                                       keep_fraction=cfg.group_filter_keep_fraction)
    counts: dict[str, int] = defaultdict(int)
    masks, filtered = [], []
    for t in trajs:
        reasons = [name for name, f in filters if f(t, cfg)]
        if kept_groups is not None and t.uid not in kept_groups:
            reasons.append("group_std")
        for r in reasons:
            counts[r] += 1
        mask = t.loss_mask()
        masks.append(np.zeros_like(mask) if reasons else mask)
        filtered.append(bool(reasons))
    counts["any"] = sum(filtered)
    return FilterResult(masks, filtered, {k: v / len(trajs) for k, v in counts.items()})
