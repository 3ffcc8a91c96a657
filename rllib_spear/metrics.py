"""Per-iteration rollout metrics computed from trajectories (what RL people look at), and the
evaluation metrics per benchmark (``task_metrics``: success / EM / F1, mean@n, pass@k). No Ray here."""
from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any, Mapping, Sequence

import numpy as np

from .core.step_samples import sample_lengths
from .core.trajectory import Trajectory

__all__ = ["rollout_metrics", "reward_component_key", "task_metrics", "pass_at_k", "pass_at_k_values",
           "source_name", "source_table", "AVERAGE_SOURCE"]

_OPTIONAL_MEANS = ("em", "f1", "precision", "recall", "correct")
#: Agent-loop counters of the runners (``RolloutStats.loop_metrics``) and how runners combine:
#: totals add up, extremes take the max, per-runner levels (percentiles, live episodes) average.
_LOOP_STATS = {"engine_idle_s": sum, "tool_timeouts": sum, "tool_calls_abandoned": sum,
               "tool_latency_p50_s": lambda v: float(np.mean(v)), "tool_latency_p95_s": max,
               "tool_latency_max_s": max, "concurrent_episodes_max": max,
               "concurrent_episodes_mean": lambda v: float(np.mean(v)), "tool_calls_concurrent_max": max,
               # rollout_mode="agent_program": programs that raised / ran past episode_timeout_s
               "agent_program_errors": sum, "agent_program_timeouts": sum}


def _mean(xs: Sequence[float]) -> float:
    return float(np.mean(xs)) if len(xs) else 0.0


def reward_component_key(component: str) -> str:
    """The metric of a named reward component: ``reward_<component>_mean``; a namespaced one (a
    user reward function's ``reward_fns/<name>``, recipe/rewards.py) keeps its namespace as the
    prefix, ``reward_fns/<name>_mean`` (reported as ``env_runners/reward_fns/<name>_mean``)."""
    return f"{component}_mean" if "/" in component else f"reward_{component}_mean"


def rollout_metrics(trajs: Sequence[Trajectory], runner_stats: Sequence[dict[str, Any]] = (),
                    expected_version: int | None = None) -> dict[str, float]:
    """Means over the iteration's trajectories plus runner throughput.

    reward_total_mean = mean R_i (outcome + every named component + step rewards);
    :func:`reward_component_key` for each named component (reward_tool_bonus_mean, and
    reward_fns/<name>_mean for a user reward function); success_rate; em/f1/precision/recall
    means when the environment reports them; tool_call_rate = fraction of episodes with at
    least one tool call; tool_calls_per_episode; turns_mean; response_length_mean (tokens after
    the prompt); learner_samples, sample_length_mean and sample_length_max (the learner's
    samples: one per episode, or one per step with ``step_context="window"``); truncation_rate; rollout_error_rate (fraction of episodes ended by an exception
    while building a turn, ``Trajectory.rollout.error``; counted in truncation_rate too) and
    rollout_errors (their count); sandbox_weak_rate (code environments: share of episodes whose
    code ran outside bubblewrap); generation tokens/s over all runners; policy_version_lag_max;
    the agent loop's counters the runners report (``_LOOP_STATS``: engine idle time, tool-call
    latency p50/p95/max, concurrent episodes, tool timeouts and abandoned calls).
    """
    n = len(trajs)
    out: dict[str, float] = {"num_episodes": float(n)}
    if n == 0:
        return out
    out["reward_total_mean"] = _mean([t.total_reward for t in trajs])
    out["reward_outcome_mean"] = _mean([t.outcome_reward for t in trajs])
    comps = sorted({k for t in trajs for k in t.rewards})
    for k in comps:
        out[reward_component_key(k)] = _mean([t.rewards.get(k, 0.0) for t in trajs])
    if any(t.step_rewards and any(t.step_rewards) for t in trajs):
        out["reward_step_sum_mean"] = _mean([float(sum(t.step_rewards)) for t in trajs])
    stats = [t.require_stats("rollout_metrics") for t in trajs]
    out["success_rate"] = _mean([float(s.success) for s in stats])
    for k in _OPTIONAL_MEANS:
        vals = [v for v in (s.score(k) for s in stats) if v is not None]
        if vals:
            out[f"{k}_mean"] = _mean(vals)
    calls = [s.tool_calls for s in stats]
    out["tool_call_rate"] = _mean([float(c > 0) for c in calls])
    out["tool_calls_per_episode"] = _mean(calls)
    out["format_ok_rate"] = _mean([float(s.format_ok) for s in stats])
    out["turns_mean"] = _mean([t.num_steps for t in trajs])
    out["response_length_mean"] = _mean([t.response_length for t in trajs])
    out["generated_length_mean"] = _mean([t.num_generated_tokens for t in trajs])
    # what the learner trains on: one sample per episode (full layout) or per step (window)
    lengths = sample_lengths(trajs)
    out["learner_samples"] = float(len(lengths))
    out["sample_length_mean"] = _mean(lengths)
    out["sample_length_max"] = float(max(lengths))
    out["truncation_rate"] = _mean([float(t.truncated) for t in trajs])
    errored = [float(t.rollout.error is not None) for t in trajs]
    out["rollout_error_rate"] = _mean(errored)
    out["rollout_errors"] = float(sum(errored))
    weak = [float(bool(s.extra["sandbox_weak"])) for s in stats if "sandbox_weak" in s.extra]
    if weak:  # code environments: share of episodes whose code ran outside bubblewrap
        out["sandbox_weak_rate"] = _mean(weak)
    out["generated_tokens"] = float(sum(t.num_generated_tokens for t in trajs))
    gen_t = sum(float(s.get("generation_time_s", 0.0)) for s in runner_stats)
    if gen_t > 0:
        # Runners work in parallel: per-runner rates add up.
        out["gen_tokens_per_s"] = float(sum(
            s.get("generated_tokens", 0) / s["generation_time_s"]
            for s in runner_stats if s.get("generation_time_s", 0) > 0))
    out["env_time_s"] = sum(float(s.get("env_time_s", 0.0)) for s in runner_stats)
    out["generation_time_s"] = gen_t
    for key, combine in _LOOP_STATS.items():  # the agent loop's counters (docs/design.md "The agent loop")
        vals = [float(s[key]) for s in runner_stats if key in s]
        if vals:
            out[key] = combine(vals)
    if expected_version is not None:
        out["policy_version"] = float(max(t.policy_version for t in trajs))
        out["policy_version_lag_max"] = float(max(expected_version - t.policy_version for t in trajs))
    return out


#: The row of the unweighted average over sources (the papers' "avg" column).
AVERAGE_SOURCE = "avg"
#: ``data_source`` values that mean "none given" (the task loaders write "unknown").
_NO_SOURCE = (None, "", "unknown")
#: Scores of :class:`EpisodeStats` averaged per source when the environment reports them.
_TASK_SCORES = ("em", "f1", "precision", "recall")
#: Rollout means kept as run-wide numbers of an evaluation.
_EVAL_GLOBALS = ("reward_outcome_mean", "tool_call_rate", "tool_calls_per_episode", "turns_mean",
                 "response_length_mean", "truncation_rate", "rollout_error_rate")
# TensorBoard tags allow [A-Za-z0-9_.-/] (tensorboardX replaces anything else with "_"), and "/"
# separates the levels of a tag: a source name keeps the rest and loses "/".
_TAG_UNSAFE = re.compile(r"[^\w.-]")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task from ``n`` samples, ``c`` of them correct (Chen et al. 2021,
    "Evaluating Large Language Models Trained on Code"):

        pass@k = 1 - C(n - c, k) / C(n, k)        (= 1 when n - c < k)

    the probability that k samples drawn without replacement from the n contain a correct one.
    pass@1 = c / n; pass@n = 1 if c > 0 else 0."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"pass_at_k: n (samples of the task) must be an integer >= 1, got {n!r}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c (correct samples) must be in [0, n={n}], got {c!r}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k must be in [1, n={n}], got {k!r}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_at_k_values(n: int) -> list[int]:
    """The k reported for n samples: 1, 2, 4, ... (powers of two) up to n, and n itself."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    return ks + ([n] if n >= 1 and ks[-1] != n else [])


def source_name(task: Mapping[str, Any], default: str = "all") -> str:
    """The benchmark a task belongs to: its ``data_source``, else ``default`` (the dataset's name),
    made a safe TensorBoard tag level (characters other than letters, digits, ``_ . -`` become
    ``_``; the reserved row name "avg" becomes "avg_")."""
    src = task.get("data_source")
    name = _TAG_UNSAFE.sub("_", str(default if src in _NO_SOURCE else src)) or "all"
    return name + "_" if name == AVERAGE_SOURCE else name


def _source_metrics(groups: Sequence[Sequence[Trajectory]]) -> dict[str, float]:
    """Scores of one source from its tasks' sample groups (macro: per task, the mean over its
    samples; then the mean over tasks)."""
    n_min = min(len(g) for g in groups)
    out = {"num_tasks": float(len(groups)), "num_episodes": float(sum(len(g) for g in groups))}
    correct = [[bool(t.require_stats("task_metrics").success) for t in g] for g in groups]
    out["success"] = _mean([_mean([float(c) for c in cs]) for cs in correct])
    for key in _TASK_SCORES:
        per_task = []
        for g in groups:
            vals = [t.stats.score(key) for t in g]
            if any(v is not None for v in vals):
                per_task.append(_mean([v or 0.0 for v in vals]))
        if per_task:
            out[key] = _mean(per_task)
    if n_min > 1:
        out[f"mean_at_{n_min}"] = out["success"]
        for k in pass_at_k_values(n_min):
            out[f"pass_at_{k}"] = _mean([pass_at_k(len(cs), sum(cs), k) for cs in correct])
    return out


def task_metrics(trajs: Sequence[Trajectory], runner_stats: Sequence[dict[str, Any]] = (), *,
                 default_source: str = "all") -> dict[str, float]:
    """Evaluation metrics per benchmark (``data_source``) and their unweighted average, as one
    flat dict (docs/design.md "Validation"):

    * ``<source>/num_tasks``, ``<source>/num_episodes``;
    * ``<source>/success``, and ``em`` / ``f1`` / ``precision`` / ``recall`` when the environment
      reports them: per task, the mean over its n samples; then the mean over the source's tasks
      (macro; a sample that reports no score counts 0 when another sample of the task does);
    * with n > 1 samples per task: ``<source>/mean_at_<n>`` (= success, the mean over the n
      samples) and ``<source>/pass_at_<k>`` for k = 1, 2, 4, ... <= n and n, each the mean over
      tasks of :func:`pass_at_k` (unbiased, 1 - C(n-c, k) / C(n, k), c = successful samples);
      with unequal group sizes, n is the smallest;
    * ``avg/<metric>``: the unweighted mean over the sources that have the metric (each
      benchmark counts once, whatever its size: the papers' "avg" column);
    * run-wide, without a "/": ``num_tasks``, ``num_episodes``, ``num_sources`` and the rollout
      means ``reward_outcome_mean``, ``tool_call_rate``, ``tool_calls_per_episode``,
      ``turns_mean``, ``response_length_mean``, ``truncation_rate``, ``rollout_error_rate``.

    Tasks are the trajectories' uids; a task's source is :func:`source_name` of its task dict
    (``default_source`` when it has no ``data_source``). Names avoid "@" (pass_at_4, not pass@4):
    TensorBoard tags allow only letters, digits and ``_ . - /``.
    """
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_task[t.uid].append(t)
    by_source: dict[str, list[list[Trajectory]]] = defaultdict(list)
    for group in by_task.values():
        by_source[source_name(group[0].task, default_source)].append(group)
    per_source = {s: _source_metrics(groups) for s, groups in sorted(by_source.items())}
    out: dict[str, float] = {}
    for s, m in per_source.items():
        out.update({f"{s}/{k}": v for k, v in m.items()})
    score_keys = [k for m in per_source.values() for k in m if not k.startswith("num_")]
    for k in dict.fromkeys(score_keys):  # first-seen order, no repeats
        out[f"{AVERAGE_SOURCE}/{k}"] = _mean([m[k] for m in per_source.values() if k in m])
    rollout = rollout_metrics(trajs, runner_stats)
    out["num_tasks"] = float(len(by_task))
    out["num_episodes"] = float(len(trajs))
    out["num_sources"] = float(len(per_source))
    out.update({k: rollout[k] for k in _EVAL_GLOBALS if k in rollout})
    return out


def source_table(metrics: Mapping[str, float]) -> tuple[list[str], list[str], dict[str, dict[str, float]]]:
    """(rows, columns, cells) of a :func:`task_metrics` dict: one row per source, then "avg";
    the columns are the metric names in first-seen order; ``cells[row][column]``. The "avg"
    row's ``num_tasks`` / ``num_episodes`` are the run's totals."""
    cells: dict[str, dict[str, float]] = defaultdict(dict)
    for key, v in metrics.items():
        if "/" in key:
            row, col = key.split("/", 1)
            cells[row][col] = v
    for col in ("num_tasks", "num_episodes"):
        if AVERAGE_SOURCE in cells and col in metrics:
            cells[AVERAGE_SOURCE][col] = metrics[col]
    rows = [r for r in cells if r != AVERAGE_SOURCE] + ([AVERAGE_SOURCE] if AVERAGE_SOURCE in cells else [])
    cols = list(dict.fromkeys(c for r in rows for c in cells[r]))
    return rows, cols, dict(cells)
