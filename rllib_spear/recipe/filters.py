"""Response filters (Dr.BoT, docs/algorithms.md 1.5), selected by ``response_filters``.

A filtered response keeps its place in the group statistics (its reward still counts in its
group's baseline); its loss mask becomes 0. A filter is ``fn(traj, cfg) -> bool`` (True = mask
it out), or a list with one bool per step (True = that step is flagged). The group filter
(``group_filter_keep_fraction``) keeps the groups with the largest reward spread. Add a filter
with::

    @register_response_filter("too_short")
    def too_short(traj, cfg) -> bool: return traj.num_generated_tokens < 4

and select it with ``.training(response_filters=("overlong", "too_short"))``.

``filter_scope`` says what a flag masks. ``"episode"`` (the default): the whole episode, a
per-step list included when any step is flagged. ``"step"``: a per-step list masks only the
assistant tokens of the flagged steps, as the released agent tree does, where every step is a
sample and a filter zeroes that sample's mask (in the window layout the flagged step samples
are masked and the others train); a bool still masks the episode. The built-in filters answer
per step under ``"step"`` (overlong with ``overlong_scope="turn"``: the turns stopped at their
cap; incomplete: ``EpisodeStats.incomplete_steps`` when the environment reports it; repetitive and
unreadable: each turn's tokens / text on its own) and per episode otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..core.filters import group_std_filter, has_repetitive_ngram, is_unreadable
from ..core.step_samples import assistant_spans
from ..core.trajectory import Trajectory
from ..registry import Registry
from .piece import ErrorFn, Piece, check_choice, check_ints, piece_decorator

__all__ = ["RESPONSE_FILTERS", "register_response_filter", "FilterResult", "apply_filters", "DRBOT_FILTERS",
           "OVERLONG_SCOPES", "FILTER_SCOPES", "NEARLY_ALL_FILTERED", "TOOL_USE_COLD_START",
           "filtered_batch_warning", "masked_response"]

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

#: ``filter_scope`` values: what a response filter's flag masks (module doc).
FILTER_SCOPES = ("episode", "step")


def _per_step(cfg: Any) -> bool:
    return getattr(cfg, "filter_scope", "episode") == "step"


def _per_turn(flags: Any, traj: Trajectory) -> list[bool]:
    """One flag per assistant turn of ``traj``: a record that lists fewer turns (one written
    before the field existed, an episode that ended before the environment saw its last turn)
    leaves the missing turns unflagged."""
    out = [bool(x) for x in flags]
    return out + [False] * (traj.num_steps - len(out))


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
    turn that reached ``max_new_tokens`` trips it: with ``filter_scope="step"`` only those turns
    are masked (the released agent tree), else the whole episode (docs/recipes.md, "Token
    budgets"). An episode that reached its own budget or the context is masked whole.
    """
    if traj.rollout.reached_max_length:
        return True
    if cfg.overlong_scope != "turn":
        return False
    capped = _per_turn(traj.rollout.turn_hit_cap, traj)
    return capped if _per_step(cfg) else any(capped)


@register_response_filter("incomplete")
def incomplete(traj: Trajectory, cfg: Any) -> bool | list[bool]:
    """No valid final answer / action (``EpisodeStats.has_answer`` is False); with
    ``filter_scope="step"`` the steps the environment reports without one
    (``EpisodeStats.incomplete_steps``; an environment that does not report them: the episode)."""
    stats = traj.require_stats("incomplete filter")
    if _per_step(cfg) and stats.incomplete_steps:
        return _per_turn(stats.incomplete_steps, traj)
    return not stats.has_answer


def _check_ngram(cfg: Any, err: ErrorFn) -> None:
    check_ints(cfg, err, ("filter_ngram_size", "filter_ngram_repeats"), 1)


@register_response_filter("repetitive", defaults={"filter_ngram_size": 20, "filter_ngram_repeats": 10},
                          validate=_check_ngram)
def repetitive(traj: Trajectory, cfg: Any) -> bool | list[bool]:
    """An n-gram of the generated tokens repeats ``filter_ngram_repeats`` times or more (per step
    with ``filter_scope="step"``: each turn's tokens on their own, as the released per-sample check)."""
    def check(ids: list[int]) -> bool:
        return has_repetitive_ngram(ids, n=cfg.filter_ngram_size, min_count=cfg.filter_ngram_repeats)

    turns = traj.assistant_token_ids()
    if _per_step(cfg):
        return [check(list(t)) for t in turns]
    return check([tok for seg in turns for tok in seg])


@register_response_filter("unreadable")
def unreadable(traj: Trajectory, cfg: Any) -> bool | list[bool]:
    """The decoded text holds replacement characters / mojibake (per turn with ``filter_scope="step"``)."""
    if _per_step(cfg):
        return _per_turn([is_unreadable(text) for text in traj.rollout.assistant_texts], traj)
    return is_unreadable("".join(traj.rollout.assistant_texts))


@dataclass
class FilterResult:
    """``masks``: the loss mask of each trajectory (zeros where filtered); ``filtered``: whether
    any of it was; ``masked_steps``: per trajectory, the steps a per-step flag masked while the
    rest trains (``filter_scope="step"``; empty elsewhere, and for a trajectory masked whole);
    ``fractions``: per reason (and ``any``), the share of the batch's trajectories it masked
    (wholly or in part)."""

    masks: list[np.ndarray]
    filtered: list[bool]
    fractions: dict[str, float]
    masked_steps: list[list[int]] | None = None

    @property
    def masked_whole(self) -> list[bool]:
        """Per trajectory: its whole loss mask was zeroed (not only some steps)."""
        steps = self.masked_steps or [[] for _ in self.filtered]
        return [f and not s for f, s in zip(self.filtered, steps)]


def _step_spans(traj: Trajectory) -> list[tuple[int, int]]:
    """[start, end) of each assistant segment (step) in the trajectory's input_ids."""
    return [(start, start + len(seg.token_ids)) for seg, start in assistant_spans(traj)]


def _flagged_steps(name: str, flag: Any, num_steps: int) -> bool | list[int]:
    """A filter's answer as True / False (the episode) or the indices of its flagged steps."""
    if isinstance(flag, (bool, np.bool_)):
        return bool(flag)
    flags = [bool(x) for x in flag]
    if len(flags) != num_steps:
        raise ValueError(f"response filter {name!r} returned {len(flags)} per-step flags for a trajectory of "
                         f"{num_steps} steps: return one bool per assistant turn, or one bool for the episode")
    return [k for k, x in enumerate(flags) if x]


def apply_filters(trajs: list[Trajectory], cfg: Any) -> FilterResult:
    """Run ``cfg.response_filters`` (in order) and the group-std filter on the batch."""
    filters = [(name, RESPONSE_FILTERS.get(name)) for name in cfg.response_filters]
    per_step = _per_step(cfg)
    kept_groups = None
    if cfg.group_filter_keep_fraction is not None:
        kept_groups = group_std_filter([t.total_reward for t in trajs], [t.uid for t in trajs],
                                       keep_fraction=cfg.group_filter_keep_fraction)
    # every configured reason is reported, 0 included: a curve with gaps reads as "not measured"
    counts: dict[str, int] = {name: 0 for name, _ in filters}
    if kept_groups is not None:
        counts["group_std"] = 0
    masks, filtered, masked_steps = [], [], []
    for t in trajs:
        spans = _step_spans(t)
        whole, steps, reasons = False, set(), []
        for name, f in filters:
            hit = _flagged_steps(name, f(t, cfg), len(spans))
            if hit is True or (hit and not per_step):
                whole = True
            elif hit:
                steps.update(hit)
            if hit:
                reasons.append(name)
        if kept_groups is not None and t.uid not in kept_groups:
            whole = True
            reasons.append("group_std")
        for r in reasons:
            counts[r] = counts.get(r, 0) + 1
        mask = t.loss_mask()
        if whole:
            mask, steps = np.zeros_like(mask), set()
        for k in sorted(steps):
            mask[spans[k][0]:spans[k][1]] = 0.0
        masks.append(mask)
        filtered.append(bool(reasons))
        masked_steps.append(sorted(steps))
    counts["any"] = sum(filtered)
    return FilterResult(masks, filtered, {k: v / len(trajs) for k, v in counts.items()}, masked_steps)


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
