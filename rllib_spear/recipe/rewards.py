"""Reward shapers (docs/algorithms.md 2.1, 3.2) and user reward functions.

A shaper edits the iteration's trajectories in place, before advantages: it adds a named
component to ``traj.rewards`` (summed into R_i), or writes ``traj.step_rewards`` / replaces
``traj.outcome_reward``; it returns its metrics. A config lists the shapers it runs, in order,
in ``reward_shapers``; their knobs are ``training()`` kwargs. Add one with::

    @register_reward_shaper("my_bonus", defaults={"my_bonus_scale": 0.1}, metrics_namespace="my")
    def my_bonus(trajs, step, cfg) -> dict[str, float]: ...

User reward functions are the short form (TRL's ``reward_funcs``, verl's ``compute_score``):
``.training(reward_fns=[fn])`` with ``fn(task: dict, response: str, stats: EpisodeStats) -> float``
(``response``: the episode's assistant texts joined); each adds the component
``reward_fns/<fn name>`` to R_i. ``register_reward_fn(name)`` makes one selectable by name.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..core.diversity import diversity_step_details
from ..core.schedules import spader_tool_cost, tool_call_bonus, tool_reward_weight
from ..core.trajectory import Trajectory
from ..registry import Registry
from .piece import ErrorFn, Piece, check_choice, check_ints, check_numbers, piece_decorator

__all__ = ["REWARD_SHAPERS", "REWARD_FNS", "register_reward_shaper", "register_reward_fn",
           "resolve_reward_fns", "apply_reward_fns", "USER_REWARD_PREFIX"]

REWARD_SHAPERS: Registry[Piece] = Registry("reward shaper", register_hint="rllib_spear.recipe.register_reward_shaper")
REWARD_FNS: Registry[Callable] = Registry("reward function", register_hint="rllib_spear.recipe.register_reward_fn")
USER_REWARD_PREFIX = "reward_fns/"


def register_reward_shaper(name: str, *, defaults: dict[str, Any] | None = None,
                           validate: Callable[[Any, ErrorFn], None] | None = None,
                           metrics_namespace: str | None = None, override: bool = False) -> Callable:
    """Decorator: register ``fn(trajs: list[Trajectory], step: int, cfg) -> dict[str, float]``."""
    return piece_decorator(REWARD_SHAPERS, name, defaults=defaults, validate=validate,
                           metrics_namespace=metrics_namespace, override=override)


def register_reward_fn(name: str, fn: Callable | None = None, *, override: bool = False) -> Any:
    """Register a user reward function ``fn(task, response, stats) -> float`` under ``name``
    (usable as a decorator), so that ``.training(reward_fns=[name])`` selects it."""
    return REWARD_FNS.register(name, fn, override=override)


def _pad(seq: list, n: int, fill: Any) -> list:
    return list(seq[:n]) + [fill] * max(0, n - len(seq))


# ------------------------------------------------------------------ 2.1 tool-call bonus
TOOL_BONUS_DEFAULTS: dict[str, Any] = {
    "tool_reward_schedule": "cosine",  # "none" | "constant" | "cosine"
    "tool_reward_steps": 200,  # T_tool
    "tool_reward_per_call": 0.1,
    "tool_reward_cap": 1.0,
    "tool_reward_variant": "posneg",  # "posneg" (both signs) | "qwen3" (indicator on correct)
}


def _check_tool_bonus(cfg: Any, err: ErrorFn) -> None:
    check_choice(cfg, err, "tool_reward_schedule", ("none", "constant", "cosine"))
    check_choice(cfg, err, "tool_reward_variant", ("posneg", "qwen3"))
    check_ints(cfg, err, ("tool_reward_steps",), 1)
    check_numbers(cfg, err, ("tool_reward_per_call", "tool_reward_cap"))


@register_reward_shaper("tool_call_bonus", defaults=TOOL_BONUS_DEFAULTS, validate=_check_tool_bonus,
                        metrics_namespace="spear")
def tool_call_bonus_shaper(trajs: list[Trajectory], step: int, cfg: Any) -> dict[str, float]:
    """SPEAR 2.1: ``rewards["tool_bonus"] = lambda_tool(t) * r_tool`` with
    r_tool = min(per_call * n_calls, cap) ("posneg"), or 1[n_calls > 0] on correct episodes ("qwen3")."""
    lam = tool_reward_weight(step, cfg.tool_reward_schedule, cfg.tool_reward_steps)
    for t in trajs:
        stats = t.require_stats("tool_call_bonus")
        n = stats.tool_calls
        if cfg.tool_reward_variant == "qwen3" and stats.success:
            r_tool = float(n > 0)
        else:
            r_tool = tool_call_bonus(n, cfg.tool_reward_per_call, cfg.tool_reward_cap)
        t.rewards["tool_bonus"] = lam * r_tool
    return {"tool_reward_weight": lam}


# ------------------------------------------------------------------ 3.2 diversity reward and tool cost
DIVERSITY_DEFAULTS: dict[str, Any] = {
    "diversity_alpha": 1.0,
    "diversity_beta": 4.0,
    "diversity_lambda": 1.0,
    "final_answer_weight": 1.0,
    "format_error_reward": 0.0,  # released code; the paper's figure says -1
}
TOOL_COST_DEFAULTS: dict[str, Any] = {
    "tool_round_cost": 0.01,
    "cost_free_steps": 100,  # the Llama script used 200
    "cost_rampup_steps": 100,
}


def _check_diversity(cfg: Any, err: ErrorFn) -> None:
    check_numbers(cfg, err, ("diversity_alpha", "diversity_beta", "diversity_lambda", "final_answer_weight"))
    if cfg.format_error_reward not in (0, 0.0, -1, -1.0):
        err(f"`format_error_reward` must be 0 (released code) or -1 (paper), got {cfg.format_error_reward!r}")


def _check_tool_cost(cfg: Any, err: ErrorFn) -> None:
    check_numbers(cfg, err, ("tool_round_cost",))
    check_ints(cfg, err, ("cost_free_steps", "cost_rampup_steps"))


def _diversity_inputs(trajs: list[Trajectory], who: str) -> tuple[list, list, list]:
    found, queries, gold = [], [], []
    for t in trajs:
        s = t.require_stats(who)
        n = max(t.num_steps, 1)
        found.append(_pad(list(s.require("found_entities_per_step", who)), n, []))
        queries.append(_pad(list(s.queries_per_step), n, 0))
        gold.append(int(s.require("num_gold_entities", who)))
    return found, queries, gold


def add_step_rewards(env: Sequence[float], extra: Sequence[float]) -> list[float]:
    """``env_k + extra_k`` per step, the shorter list padded with zeros."""
    n = max(len(env), len(extra))
    return [float((env[k] if k < len(env) else 0.0) + (extra[k] if k < len(extra) else 0.0)) for k in range(n)]


def _spader_step_rewards(trajs: list[Trajectory], step: int, cfg: Any, tool_cost: float) -> dict[str, float]:
    who = "spader_diversity"
    found, queries, gold = _diversity_inputs(trajs, who)
    details = diversity_step_details(
        found, queries, [t.uid for t in trajs], gold, alpha=cfg.diversity_alpha,
        beta=cfg.diversity_beta, lam=cfg.diversity_lambda, tool_cost=tool_cost)
    uniq: dict[str, set] = {}
    for i, t in enumerate(trajs):
        s = t.stats
        # added to the environment's own step rewards (a penalty it paid stays in R_i)
        t.step_rewards = add_step_rewards(t.step_rewards, details.rewards[i][: max(t.num_steps, 1)])
        f1 = s.require("f1", who)
        t.outcome_reward = cfg.final_answer_weight * f1 if s.format_ok else float(cfg.format_error_reward)
        t.derived["entities_found"] = int(sum(details.num_new[i]))
        t.derived["rarity_weighted"] = float(sum(details.rarity_weighted[i]))
        uniq.setdefault(t.uid, set()).update(e for st in details.new_entities[i] for e in st)
    return {
        "step_reward_mean": float(np.mean([r for rs in details.rewards for r in rs] or [0.0])),
        "entities_found_per_episode": float(np.mean([t.derived["entities_found"] for t in trajs])),
        "unique_entities_per_group": float(np.mean([len(s) for s in uniq.values()])),
        "rarity_weighted_discoveries": float(np.mean([t.derived["rarity_weighted"] for t in trajs])),
        "queries_per_step": float(np.mean([q for qs in queries for q in qs] or [0.0])),
        "tool_cost_weight": float(tool_cost),
    }


@register_reward_shaper("spader_diversity", defaults={**DIVERSITY_DEFAULTS, **TOOL_COST_DEFAULTS},
                        validate=lambda cfg, err: (_check_diversity(cfg, err), _check_tool_cost(cfg, err)),
                        metrics_namespace="spader")
def spader_diversity_shaper(trajs: list[Trajectory], step: int, cfg: Any) -> dict[str, float]:
    """SPADER 3.2: ``step_rewards[k]`` = diversity reward of the gold entities first found in
    step k (rarer within the group = more) minus the scheduled tool cost c(t) * Q_k / |GT|; the
    outcome becomes ``final_answer_weight * F1`` (``format_error_reward`` on malformed output)."""
    cost = spader_tool_cost(step, cfg.tool_round_cost, cfg.cost_free_steps, cfg.cost_rampup_steps)
    return _spader_step_rewards(trajs, step, cfg, cost)


# ------------------------------------------------------------------ user reward functions
def resolve_reward_fns(specs: Any) -> list[tuple[str, Callable]]:
    """(component name, function) per entry of ``reward_fns``: a callable or a registered name."""
    out = []
    for spec in specs or ():
        fn = REWARD_FNS.get(spec) if isinstance(spec, str) else spec
        if not callable(fn):
            raise ValueError(f"`reward_fns` entries must be callables fn(task, response, stats) -> float or "
                             f"names registered with register_reward_fn, got {spec!r}")
        name = spec if isinstance(spec, str) else getattr(fn, "__name__", type(fn).__name__)
        out.append((USER_REWARD_PREFIX + name, fn))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ValueError(f"`reward_fns` gives two functions the same name: {names}")
    return out


def apply_reward_fns(trajs: list[Trajectory], fns: list[tuple[str, Callable]]) -> dict[str, float]:
    """``rewards["reward_fns/<name>"] = fn(task, response, stats)`` for every trajectory; a
    function that raises or returns a non-finite / non-number value stops the run, naming it."""
    for t in trajs:
        stats = t.require_stats("reward_fns")
        response = "".join(t.rollout.assistant_texts)
        for name, fn in fns:
            v = fn(t.task, response, stats)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) or not np.isfinite(v):
                raise ValueError(f"reward function {name[len(USER_REWARD_PREFIX):]!r} returned {v!r} for task "
                                 f"{t.uid!r}; it must return a finite float")
            t.rewards[name] = float(v)
    return {}
