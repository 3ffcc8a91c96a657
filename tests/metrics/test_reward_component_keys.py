"""The metric names of named reward components (rllib_spear/metrics.py): a built-in shaper's
component is ``reward_<name>_mean``; a user reward function's ``reward_fns/<name>`` component
keeps its namespace, ``reward_fns/<name>_mean`` (``env_runners/reward_fns/<name>_mean`` in a
result; README "Your own environment"), not ``reward_reward_fns/<name>_mean``."""
from __future__ import annotations

from rllib_spear.core.trajectory import Segment, Trajectory
from rllib_spear.metrics import reward_component_key, rollout_metrics
from rllib_spear.recipe.rewards import USER_REWARD_PREFIX
from rllib_spear.testing import make_stats


def _traj(rewards: dict[str, float]) -> Trajectory:
    segs = [Segment("prompt", [1, 2]), Segment("assistant", [10, 11], [-0.5, -0.5], step=0)]
    t = Trajectory(uid="q", segments=segs, outcome_reward=1.0, step_rewards=[0.0], stats=make_stats(success=True),
                   task={"answer": "x"})
    t.rewards.update(rewards)
    return t


def test_component_keys():
    assert reward_component_key("tool_bonus") == "reward_tool_bonus_mean"
    assert reward_component_key(USER_REWARD_PREFIX + "tidy_answer") == "reward_fns/tidy_answer_mean"


def test_rollout_metrics_log_a_user_reward_fn_once_prefixed():
    m = rollout_metrics([_traj({"reward_fns/tidy_answer": 0.1, "tool_bonus": 0.2}), _traj({"tool_bonus": 0.0})])
    assert m["reward_fns/tidy_answer_mean"] == 0.05 and m["reward_tool_bonus_mean"] == 0.1
    assert not any(k.startswith("reward_reward_fns") for k in m)
