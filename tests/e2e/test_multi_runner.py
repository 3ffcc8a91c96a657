"""Two LLMEnvRunners share one iteration's tasks: whole groups, unique ids, both contribute."""
from __future__ import annotations

from collections import Counter

import rllib_spear  # noqa: F401  (registers the algorithms)
from rllib_spear import SPEARConfig

from e2e_helpers import recorder, small_config, with_trajectory_hook


def test_two_env_runners_one_iteration(ray_session, tiny_model):
    G, N = 3, 4
    cfg = (small_config(SPEARConfig, tiny_model, group_size=G, tasks_per_iteration=N)
           .env_runners(num_env_runners=2, num_cpus_per_env_runner=0.5)
           .resources(num_cpus_for_main_process=0.5))
    hook, captured = recorder()
    algo = with_trajectory_hook(cfg, hook).build_algo()
    try:
        assert algo.env_runner_group.num_remote_env_runners() == 2
        result = algo.train()
        assert len(captured) == 1
        trajs, runner_stats = captured[0]
        # both runners sampled (tasks are dealt round-robin over the healthy runners)
        assert len(runner_stats) == 2, runner_stats
        assert all(s["generated_tokens"] > 0 and s["engine_calls"] >= 1 for s in runner_stats)
        assert len(trajs) == N * G
        per_uid = Counter(t.uid for t in trajs)
        assert len(per_uid) == N, per_uid
        assert set(per_uid.values()) == {G}, per_uid
        assert len({t.traj_id for t in trajs}) == len(trajs)
        # every trajectory was sampled with the current weights
        assert {t.policy_version for t in trajs} == {runner_stats[0]["weights_seq_no"]}
        assert {s["weights_seq_no"] for s in runner_stats} == {runner_stats[0]["weights_seq_no"]}
        assert result["env_runners"]["policy_version_lag_max"] == 0
        assert result["training_iteration"] == 1
    finally:
        algo.stop()
