"""GRPO trains with the async agent loop (``.env_runners(rollout_mode="async")``, docs/design.md
"The agent loop") on the HF engine: the runner builds the async rollout, the groups come back
whole, the learner trains, and the loop's counters reach the iteration's metrics."""
from __future__ import annotations

import torch

import rllib_spear  # noqa: F401  (registers the algorithms)
from rllib_spear import GRPOConfig

from e2e_helpers import recorder, small_config, with_trajectory_hook

LOOP_METRICS = ("engine_idle_s", "tool_latency_p50_s", "tool_latency_p95_s", "tool_latency_max_s",
                "concurrent_episodes_max", "concurrent_episodes_mean", "tool_calls_concurrent_max",
                "tool_timeouts", "tool_calls_abandoned")


def _weights(algo):
    from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE

    state = algo.learner_group.get_state(components=COMPONENT_LEARNER + "/" + COMPONENT_RL_MODULE)
    (sd,) = state[COMPONENT_LEARNER][COMPONENT_RL_MODULE].values()
    return {k: torch.as_tensor(v).clone() for k, v in sd.items()}


def test_grpo_trains_two_iterations_with_the_async_loop(ray_session, tiny_model):
    hook, calls = recorder(synthetic_rewards=True)
    cfg = (small_config(GRPOConfig, tiny_model)
           .env_runners(rollout_mode="async", tool_concurrency=3, tool_timeout_s=60.0)
           .resources(num_cpus_for_main_process=0.5))
    algo = with_trajectory_hook(cfg, hook).build_algo()
    try:
        kinds = algo.env_runner_group.foreach_env_runner(lambda r: type(r._rollout).__name__,
                                                         local_env_runner=False)
        assert kinds == ["AsyncMultiTurnRollout"]
        w0 = _weights(algo)
        results = [algo.train() for _ in range(2)]
        assert algo.algo_step == 2
        for r, (trajs, stats) in zip(results, calls):
            assert len(trajs) == 8 and r["dropped_incomplete_groups"] == 0
            assert sorted({t.uid for t in trajs}) and all(t.segments[0].kind == "prompt" for t in trajs)
            (runner,) = stats
            assert runner["engine_calls"] == sum(t.num_steps for t in trajs)  # one request per turn
            env = r["env_runners"]
            assert all(k in env for k in LOOP_METRICS), sorted(env)
            assert env["concurrent_episodes_max"] == 8 and env["tool_calls_concurrent_max"] <= 3
            assert env["tool_timeouts"] == 0 and "reward_total_mean" in env
        assert any(not torch.equal(w0[k], v) for k, v in _weights(algo).items()), "the learner trained"
    finally:
        algo.stop()
