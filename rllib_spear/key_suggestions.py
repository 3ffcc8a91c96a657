"""Did you mean ...: the valid keys closest to a misspelt one (:func:`close_keys`,
:func:`did_you_mean`), and the check of a builder call's kwargs that names them
(:func:`check_kwargs`: ``.training(group_szie=8)`` -> ``'group_size'``).

A known alias comes first (``learning_rate`` -> ``lr``: other RL libraries' names for this
library's keys, :data:`KEY_ALIASES`), then a key spelt by its initials, then difflib's
near-misses. The algorithm configs check their builder kwargs with it; ``config_keys.py`` checks
an experiment's keys with it. Pure Python (difflib, inspect).
"""
from __future__ import annotations

import difflib
import inspect
from typing import Callable, Collection, Iterable

__all__ = ["KEY_ALIASES", "close_keys", "did_you_mean", "check_kwargs", "explicit_params"]


#: Names other RL libraries (TRL, verl, OpenRLHF, older RLlib) give this library's keys: difflib
#: sees no likeness between ``learning_rate`` and ``lr``, so these are suggested by name.
KEY_ALIASES = {"learning_rate": "lr", "lr_rate": "lr", "num_workers": "num_env_runners",
               "num_generations": "group_size", "n_samples": "group_size", "rollout_n": "group_size",
               "num_samples_per_prompt": "group_size", "kl_coef": "kl_coeff", "beta": "kl_coeff",
               "entropy_coef": "entropy_coeff", "epochs": "num_epochs", "ppo_epochs": "num_epochs",
               "max_tokens": "max_new_tokens", "max_completion_length": "max_new_tokens",
               "response_length": "max_response_tokens", "max_seq_len": "max_model_len",
               "max_length": "max_model_len",
               "clip_range": "clip_ratio_low", "cliprange": "clip_ratio_low", "epsilon": "clip_ratio_low",
               "max_grad_norm": "grad_clip", "warmup_steps": "lr_warmup_steps", "temp": "temperature"}


def _initials(key: str) -> str:
    """``lr`` for ``learning_rate``: the first letter of each word of a snake_case key."""
    words = [w for w in str(key).split("_") if w]
    return "".join(w[0] for w in words) if len(words) > 1 else ""


def close_keys(key: str, choices: Iterable[str], n: int = 3, cutoff: float = 0.6) -> list[str]:
    """The choices ``key`` most likely meant: a known alias (``learning_rate`` -> ``lr``), a key
    spelt by its initials, then difflib's near-misses (typos)."""
    pool = sorted(set(choices))
    named = [c for c in (KEY_ALIASES.get(str(key)), _initials(key)) if c and c in pool]
    close = difflib.get_close_matches(str(key), pool, n=n, cutoff=cutoff)
    if close:  # only the near-best: 'group_szie' means 'group_size', not also 'group_stats_over'
        best = _ratio(key, close[0])
        close = [c for c in close if _ratio(key, c) >= best - _NEAR_BEST]
    return list(dict.fromkeys(named + close))[:n]


#: How far below the best difflib ratio another suggestion may be.
_NEAR_BEST = 0.1


def _ratio(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, str(a), b).ratio()


def did_you_mean(key: str, choices: Iterable[str], n: int = 3, cutoff: float = 0.6) -> str:
    """``"; did you mean 'x'?"`` (or ``'x' or 'y'``) for the choices close to ``key``; "" when none is."""
    close = close_keys(key, choices, n=n, cutoff=cutoff)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def check_kwargs(owner: str, kwargs: Iterable[str], accepted: Collection[str]) -> None:
    """TypeError naming each key of ``kwargs`` not in ``accepted`` and the closest accepted ones
    (``owner``: "GRPOConfig.training()"): the same type as Python's own unexpected-kwarg error."""
    unknown = [k for k in kwargs if k not in accepted]
    if unknown:
        parts = [f"{k!r}{did_you_mean(k, accepted)}" for k in unknown]
        raise TypeError(f"{owner} got an unknown key " + "; ".join(parts))


def explicit_params(fn: Callable) -> tuple[set[str], bool]:
    """(named parameters of ``fn`` other than ``self``, whether it also takes ``**kwargs``)."""
    params = inspect.signature(fn).parameters.values()
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"self"}
    return names, any(p.kind is p.VAR_KEYWORD for p in params)
