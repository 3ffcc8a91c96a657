"""Per-iteration rollout metrics computed from trajectories (what RL people look at)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .core.trajectory import Trajectory

__all__ = ["rollout_metrics"]

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
    while building a turn, ``info["rollout_error"]``; counted in truncation_rate too) and
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
    out["success_rate"] = _mean([float(bool(t.info.get("success", False))) for t in trajs])
    for k in _OPTIONAL_MEANS:
        vals = [float(t.info[k]) for t in trajs if k in t.info]
        if vals:
            out[f"{k}_mean"] = _mean(vals)
    calls = [int(t.info.get("tool_calls", 0)) for t in trajs]
    out["tool_call_rate"] = _mean([float(c > 0) for c in calls])
    out["tool_calls_per_episode"] = _mean(calls)
    out["format_ok_rate"] = _mean([float(bool(t.info.get("format_ok", True))) for t in trajs])
    out["turns_mean"] = _mean([t.num_steps for t in trajs])
    out["response_length_mean"] = _mean([t.response_length for t in trajs])
    out["generated_length_mean"] = _mean([t.num_generated_tokens for t in trajs])
    out["truncation_rate"] = _mean([float(t.truncated) for t in trajs])
    errored = [float(bool(t.info.get("rollout_error"))) for t in trajs]
    out["rollout_error_rate"] = _mean(errored)
    out["rollout_errors"] = float(sum(errored))
    weak = [float(bool(t.info["sandbox_weak"])) for t in trajs if "sandbox_weak" in t.info]
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
