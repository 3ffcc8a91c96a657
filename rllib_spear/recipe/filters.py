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

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..core.filters import group_std_filter, has_repetitive_ngram, is_unreadable
from ..core.trajectory import Trajectory
from ..registry import Registry
from .piece import ErrorFn, Piece, check_choice, check_ints, piece_decorator

__all__ = ["RESPONSE_FILTERS", "register_response_filter", "FilterResult", "apply_filters", "DRBOT_FILTERS",
           "OVERLONG_SCOPES", "NEARLY_ALL_FILTERED", "TOOL_USE_COLD_START", "filtered_batch_warning",
           "masked_response"]

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
    # every configured reason is reported, 0 included: a curve with gaps reads as "not measured"
    counts: dict[str, int] = {name: 0 for name, _ in filters}
    if kept_groups is not None:
        counts["group_std"] = 0
    masks, filtered = [], []
    for t in trajs:
        reasons = [name for name, f in filters if f(t, cfg)]
        if kept_groups is not None and t.uid not in kept_groups:
            reasons.append("group_std")
        for r in reasons:
            counts[r] = counts.get(r, 0) + 1
        mask = t.loss_mask()
        masks.append(np.zeros_like(mask) if reasons else mask)
        filtered.append(bool(reasons))
    counts["any"] = sum(filtered)
    return FilterResult(masks, filtered, {k: v / len(trajs) for k, v in counts.items()})


#: A batch whose filters masked this share of its responses or more trains (almost) nothing.
NEARLY_ALL_FILTERED = 0.9

#: The cold start a new ``FunctionToolEnv`` (Hermes ``<tool_call>``, ``<answer>``) starts from on CPU.
TOOL_USE_COLD_START = "smollm2-tools"

#: What to look at when one filter masks (nearly) a whole batch: the knob, and the usual cause
#: ("incomplete" depends on the model in use: ``_incomplete_hint``).
_FILTER_HINTS = {
    "overlong": ("the responses reach the token budget: raise env_runners(max_response_tokens=..., "
                 "max_new_tokens=...), or set training(overlong_scope='episode') or drop 'overlong' from "
                 "training(response_filters=...)"),
    "repetitive": ("the responses repeat an n-gram: see training(filter_ngram_size=..., filter_ngram_repeats=...) "
                   "or drop 'repetitive' from training(response_filters=...)"),
    "unreadable": ("the decoded responses hold replacement characters (a tokenizer / model mismatch?), or drop "
                   "'unreadable' from training(response_filters=...)"),
    "group_std": ("every group's rewards are (nearly) equal: raise training(group_filter_keep_fraction=...) or "
                  "set it to None"),
}


def _incomplete_hint(model: str | None) -> str:
    """Why responses lack a final answer, and what to try; never the model already in use
    (``model``: the name of the cold start in use, ``coldstart.lookup.cold_start_name``)."""
    head = ("the responses have no valid final answer in the environment's format (on an agent task: some step of "
            "the episode held no action in the format, docs/algorithms.md 1.5): check that the model speaks it")
    tail = "or drop 'incomplete' from training(response_filters=...)"
    if model == TOOL_USE_COLD_START:
        return (f"{head}. The model in use ({TOOL_USE_COLD_START!r}) was taught FunctionToolEnv's format (a Hermes "
                "<tool_call>, then <answer>...</answer>) on synthetic tools: check that your environment's prompt "
                "lists its tools and asks for that format, and that env_runners(max_new_tokens=...) leaves room "
                "for a call; an environment with another format needs a cold start of its own "
                "(rllib_spear.models.sft.cold_start_sft on demonstrations of it) or a larger instruct model; "
                + tail)
    return (f"{head} (the embedded model only speaks the embedded search tasks' format, and an instruct model "
            "such as 'smollm2-instruct' answers a new tool's requests in prose). For a new FunctionToolEnv on CPU, "
            f"start from the tool-use cold start: rl_module(model_config={{'model_path': {TOOL_USE_COLD_START!r}}}) "
            "(SmolLM2-135M taught the Hermes <tool_call> format, built on first use), or a local HF instruct model "
            "that calls tools; " + tail)


def masked_response(trajs: Sequence[Trajectory], filtered: Sequence[bool], limit: int = 300) -> str | None:
    """One masked response of the batch, as the model wrote it: the first filtered trajectory's
    assistant turns (joined with `` | ``), cut to ``limit`` characters; None if none is masked."""
    for t, masked in zip(trajs, filtered):
        if masked:
            text = " | ".join(t.rollout.assistant_texts) or "(no turn generated)"
            return repr(text if len(text) <= limit else text[:limit] + "...")
    return None


def filtered_batch_warning(fractions: dict[str, float], threshold: float = NEARLY_ALL_FILTERED, *,
                           sample: str | None = None, model: str | None = None) -> str | None:
    """A warning when the filters masked ``threshold`` of the batch or more, naming the filter
    that masked the most and its knob, and quoting ``sample`` (one masked response,
    :func:`masked_response`); None otherwise. ``model``: the name of the cold start in use
    (``coldstart.lookup.cold_start_name``) or its folder, never recommended."""
    share = fractions.get("any", 0.0)
    if share < threshold:
        return None
    by_share = sorted(((v, k) for k, v in fractions.items() if k != "any"), reverse=True)
    top = by_share[0][1] if by_share else "any"
    hint = _incomplete_hint(model) if top == "incomplete" else _FILTER_HINTS.get(
        top, f"see what the filter {top!r} checks, or drop it from training(response_filters=...)")
    detail = ", ".join(f"{k} {v:.0%}" for v, k in by_share if v > 0)
    quoted = f" One masked response: {sample}" if sample else ""
    return (f"the response filters masked {share:.0%} of this batch ({detail}): it trains (almost) nothing. "
            f"Most of it is '{top}': {hint}.{quoted}")
