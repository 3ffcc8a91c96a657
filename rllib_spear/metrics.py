"""Per-iteration rollout metrics computed from trajectories (what RL people look at)."""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Sequence

import numpy as np

from .core.trajectory import Trajectory

__all__ = ["rollout_metrics", "task_metrics"]

_OPTIONAL_MEANS = ("em", "f1", "precision", "recall", "correct")


def _mean(xs: Sequence[float]) -> float:
    return float(np.mean(xs)) if len(xs) else 0.0


def rollout_metrics(trajs: Sequence[Trajectory], runner_stats: Sequence[dict[str, Any]] = (),
                    expected_version: int | None = None) -> dict[str, float]:
    """Means over the iteration's trajectories plus runner throughput.

    reward_total_mean = mean R_i (outcome + every named component + step rewards);
    reward_<component>_mean for each named component; success_rate; em/f1/precision/recall
    means when the environment reports them; tool_call_rate = fraction of episodes with at
    least one tool call; tool_calls_per_episode; turns_mean; response_length_mean (tokens after
    the prompt); truncation_rate; rollout_error_rate (fraction of episodes ended by an exception
    while building a turn, ``Trajectory.rollout.error``; counted in truncation_rate too) and
    rollout_errors (their count); sandbox_weak_rate (code environments: share of episodes whose
    code ran outside bubblewrap); generation tokens/s over all runners; policy_version_lag_max.
    """
    n = len(trajs)
    out: dict[str, float] = {"num_episodes": float(n)}
    if n == 0:
        return out
    out["reward_total_mean"] = _mean([t.total_reward for t in trajs])
    out["reward_outcome_mean"] = _mean([t.outcome_reward for t in trajs])
    comps = sorted({k for t in trajs for k in t.rewards})
    for k in comps:
        out[f"reward_{k}_mean"] = _mean([t.rewards.get(k, 0.0) for t in trajs])
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
    if expected_version is not None:
        out["policy_version"] = float(max(t.policy_version for t in trajs))
        out["policy_version_lag_max"] = float(max(expected_version - t.policy_version for t in trajs))
    return out


def task_metrics(trajs: Sequence[Trajectory], runner_stats: Sequence[dict[str, Any]] = ()) -> dict[str, float]:
    """Evaluation metrics: the rollout means plus macro precision / recall / F1 / EM / success
    (per question, averaged over its samples, then over questions) for the scores the
    environment reports."""
    m = rollout_metrics(trajs, runner_stats)
    by_q: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_q[t.uid].append(t)
    for key in ("precision", "recall", "f1", "em", "success"):
        per_q = []
        for ts in by_q.values():
            vals = [float(t.stats.success) if key == "success" else t.stats.score(key) for t in ts]
            if any(v is not None for v in vals):
                per_q.append(float(np.mean([v or 0.0 for v in vals])))
        if per_q:
            m[f"macro_{key}"] = float(np.mean(per_q))
    m["num_tasks"] = float(len(by_q))
    keep = ("num_tasks", "num_episodes", "reward_outcome_mean", "success_rate",
            "tool_call_rate", "tool_calls_per_episode", "turns_mean", "response_length_mean")
    return {k: v for k, v in m.items() if k in keep or k.startswith("macro_") or k.endswith("_mean")}
