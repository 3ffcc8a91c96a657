"""``validate()`` of the recipe knobs: every named piece exists and its knobs are sound."""
from __future__ import annotations

from typing import Any

from .estimators import ADVANTAGE_ESTIMATORS, check_group_stats_over
from .filters import RESPONSE_FILTERS
from .piece import ErrorFn
from .rewards import REWARD_SHAPERS, resolve_reward_fns
from .self_imitation import validate_sil

__all__ = ["check_recipe"]


def _names(cfg: Any, err: ErrorFn, key: str) -> list[str]:
    v = getattr(cfg, key)
    if isinstance(v, str) or not isinstance(v, (list, tuple)):
        err(f"`{key}` must be a list/tuple of names, got {v!r}")
    return list(v)


def check_recipe(cfg: Any, err: ErrorFn) -> None:
    """Raise (through ``err``) on an unknown estimator, shaper or filter name, a bad reward
    function, or a bad knob of any selected piece and of SIL."""
    pieces = []
    for key, registry, names in (("advantage_estimator", ADVANTAGE_ESTIMATORS, [cfg.advantage_estimator]),
                                 ("reward_shapers", REWARD_SHAPERS, _names(cfg, err, "reward_shapers")),
                                 ("response_filters", RESPONSE_FILTERS, _names(cfg, err, "response_filters"))):
        for name in names:
            try:
                pieces.append(registry.get(name))
            except ValueError as e:
                err(f"`{key}`: {e}")
    check_group_stats_over(cfg, err)
    for piece in pieces:
        piece.check(cfg, err)
    try:
        resolve_reward_fns(_names(cfg, err, "reward_fns"))
    except ValueError as e:
        err(f"`reward_fns`: {e}")
    validate_sil(cfg, err)
