"""Fault tolerance of the remote LLMEnvRunner and DDP (num_learners=2) of GRPOTorchLearner."""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import rllib_spear  # noqa: F401  (registers the algorithms)
from rllib_spear import SPEARConfig

from e2e_helpers import recorder, replayer, small_config, with_trajectory_hook


# ------------------------------------------------------------------------------------ fault
def test_runner_killed_training_continues(ray_session, tiny_model):
    ray = ray_session
    cfg = (small_config(SPEARConfig, tiny_model)
           .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
           .fault_tolerance(restart_failed_env_runners=True, delay_between_env_runner_restarts_s=0))
    hook, calls = recorder()
    algo = with_trajectory_hook(cfg, hook).build_algo()
    try:
        algo.train()
        assert calls[-1][0], "first iteration sampled nothing"
        step_before = algo.algo_step
        assert step_before == 1
        group = algo.env_runner_group
        actors = group._worker_manager.actors()
        assert len(actors) == 1
        (old_id, old_actor), = actors.items()
        # RLlib restarts a failed runner through Ray's actor restarts (max_restarts), so the
        # kill must allow a restart (no_restart=True would make the runner unrecoverable).
        ray.kill(old_actor, no_restart=False)

        # An iteration without a healthy runner returns at once, while Ray restarts the killed
        # actor (a fresh worker process: seconds, longer on a loaded machine). Give the restart
        # a pause between empty iterations instead of a fixed small number of iterations.
        results = []
        for _ in range(60):
            n_calls = len(calls)
            results.append(algo.train())  # must not raise
            if len(calls) > n_calls and calls[-1][0]:
                break
            time.sleep(1.0)
        lost = [r.get("lost_all_samples", 0) for r in results]
        print(f"\nafter kill: {len(results)} train() calls; trajectories per call "
              f"{[len(c[0]) for c in calls[1:]]}; lost_all_samples {lost}; "
              f"lost_env_runner_samples {[r.get('lost_env_runner_samples') for r in results]}; "
              f"algo_step {step_before} -> {algo.algo_step}; "
              f"restored {algo._counters.get('total_num_restored_workers')}")
        assert calls[-1][0], "no iteration after the kill returned trajectories"
        assert algo.algo_step > step_before
        assert group.num_healthy_remote_workers() == 1
        assert group.healthy_env_runner_ids() == [old_id]
        # the restarted runner samples with the current weights (version-checked sync)
        last = results[-1]
        print("policy versions of the recovered iteration:",
              sorted({t.policy_version for t in calls[-1][0]}), "expected", step_before,
              "lag", last["env_runners"]["policy_version_lag_max"])
        assert last["env_runners"]["policy_version_lag_max"] == 0
        # and one more ordinary iteration works
        step = algo.algo_step
        after = algo.train()
        assert algo.algo_step == step + 1 and calls[-1][0]
        # the event counters read 0 once the runner is back, not NaN (an unlogged "sum" would)
        assert last["lost_all_samples"] == 0 and after["lost_all_samples"] == 0
        assert after["dropped_in_flight_trajectories"] == 0
    finally:
        algo.stop()


# ------------------------------------------------------------------------------------ DDP
def _ddp_config(tiny_model, num_learners):
    cfg = (small_config(SPEARConfig, tiny_model, sil_enabled=False, tool_reward_schedule="none",
                        loss_mode="vanilla", entropy_coeff=0.0)
           .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.25)
           .resources(num_cpus_for_main_process=0.25))
    if num_learners:
        cfg = cfg.learners(num_learners=num_learners, num_cpus_per_learner=0.5)
    return cfg


def _learner_weights(algo):
    from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE

    state = algo.learner_group.get_state(components=COMPONENT_LEARNER + "/" + COMPONENT_RL_MODULE)
    mod = state[COMPONENT_LEARNER][COMPONENT_RL_MODULE]["default_policy"]
    return {k: torch.as_tensor(np.asarray(v)).clone() if not isinstance(v, torch.Tensor) else v.clone()
            for k, v in mod.items()}


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def test_ddp_two_learners_match_single_learner(ray_session, tiny_model):
    # 1) single (local) learner: sample, record the trajectories, update.
    hook, calls = recorder(synthetic_rewards=True)
    algo1 = with_trajectory_hook(_ddp_config(tiny_model, 0), hook).build_algo()
    try:
        init = _learner_weights(algo1)
        r1 = algo1.train()
        trajs = calls[-1][0]
        assert trajs
        w1 = _learner_weights(algo1)
        gn1 = r1["learners"]["default_policy"]["grad_norm"]
    finally:
        algo1.stop()

    # 2) two DDP learners (gloo) on the same trajectories.
    replay, replay_state = replayer(calls[-1])
    algo2 = with_trajectory_hook(_ddp_config(tiny_model, 2), replay).build_algo()
    try:
        assert algo2.learner_group.is_remote and len(algo2.learner_group._workers) == 2
        assert _max_diff(init, _learner_weights(algo2)) == 0.0
        r2 = algo2.train()
        assert algo2.algo_step == 1
        w2 = _learner_weights(algo2)
        gn2 = r2["learners"]["default_policy"]["grad_norm"]
        # both learners hold the same weights after the step
        sums = algo2.learner_group.foreach_learner(
            lambda l: float(sum(p.detach().double().sum() for p in l.module["default_policy"].parameters())))
        sums = [s.get() for s in sums.result_or_errors]
        assert len(sums) == 2 and abs(sums[0] - sums[1]) < 1e-9, sums
        # a second iteration (fresh samples from the runner) also works
        replay_state["on"] = False
        algo2.train()
        assert algo2.algo_step == 2
    finally:
        algo2.stop()

    moved = _max_diff(init, w1)
    diff = _max_diff(w1, w2)
    print(f"\ngrad_norm 1 learner {gn1:.6g} vs 2 learners {gn2:.6g}; max |param diff| {diff:.3g} "
          f"(step size {moved:.3g})")
    assert moved > 1e-6
    # The gradient of the global batch: DDP's mean over learners times num_learners equals the
    # single-learner gradient (the optimizer is scale invariant, so check the norm directly).
    assert gn2 == pytest.approx(gn1, rel=1e-4)
    assert diff < 1e-5
