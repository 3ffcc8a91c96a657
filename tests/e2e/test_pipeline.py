"""Rollout pipelining (docs/design.md "Rollout pipelining"): one_step_off trains with every group
at most one update old, sync is today's run bit for bit, checkpoints and runner failures."""
from __future__ import annotations

import math
import time

import torch

import rllib_spear  # noqa: F401  (registers the algorithms)
from rllib_spear import GRPOConfig

from e2e_helpers import recorder, small_config, with_trajectory_hook


def _config(tiny_model, num_env_runners=2, **training):
    return (small_config(GRPOConfig, tiny_model, **training)
            .env_runners(num_env_runners=num_env_runners, num_cpus_per_env_runner=0.5)
            .resources(num_cpus_for_main_process=0.5))


def _lag_recorder():
    """(hook fn, calls): like ``recorder(synthetic_rewards=True)``, and each call also records
    every trajectory's lag (learner version now - the version it was sampled with)."""
    record, calls = recorder(synthetic_rewards=True)
    lags = []

    def hook(trajs, stats, algorithm):
        record(trajs, stats, algorithm)
        lags.append([algorithm.policy_version - t.policy_version for t in trajs])

    return hook, calls, lags


def _weights(algo):
    from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE

    state = algo.learner_group.get_state(components=COMPONENT_LEARNER + "/" + COMPONENT_RL_MODULE)
    module = state[COMPONENT_LEARNER][COMPONENT_RL_MODULE]
    (sd,) = module.values()
    return {k: torch.as_tensor(v).clone() for k, v in sd.items()}


def test_one_step_off_trains_with_lag_at_most_one(ray_session, tiny_model):
    hook, calls, lags = _lag_recorder()
    algo = with_trajectory_hook(_config(tiny_model, rollout_pipeline="one_step_off"), hook).build_algo()
    try:
        w0 = _weights(algo)
        results = [algo.train() for _ in range(3)]
        assert algo.algo_step == 3 and algo.policy_version == 3
        for k, (r, (trajs, stats), lag) in enumerate(zip(results, calls, lags), start=1):
            assert len(trajs) == 8 and len(stats) == 2, "both runners sample every batch"
            # the first batch is sampled fresh, every later one during the previous update
            assert set(lag) == ({0} if k == 1 else {1}), (k, lag)
            assert {t.policy_version for t in trajs} == {max(k - 2, 0)}
            env = r["env_runners"]
            assert env["policy_version_lag_max"] <= 1 and env["policy_lag_max"] <= 1
            assert "reward_total_mean" in env and "episode_return_mean" in env
            assert r["dropped_stale_trajectories"] == 0
        assert any(not torch.equal(w0[k], v) for k, v in _weights(algo).items()), "the learner trained"
    finally:
        algo.stop()


def test_sync_is_the_default_bit_for_bit(ray_session, tiny_model):
    def run(**training):
        hook, calls = recorder(synthetic_rewards=True)
        algo = with_trajectory_hook(_config(tiny_model, num_env_runners=1, **training), hook).build_algo()
        try:
            for _ in range(2):
                algo.train()
            return _weights(algo), [[t.assistant_token_ids() for t in trajs] for trajs, _ in calls]
        finally:
            algo.stop()

    w_default, sampled_default = run()
    w_sync, sampled_sync = run(rollout_pipeline="sync")
    assert sampled_sync == sampled_default
    assert w_sync.keys() == w_default.keys()
    assert all(torch.equal(w_sync[k], w_default[k]) for k in w_default)


def test_one_step_off_checkpoint_restore(ray_session, tiny_model, tmp_path):
    """A checkpoint taken with a sample in flight: the restored run draws that batch's tasks
    again and samples them fresh with the restored weights (lag 0), then pipelines on; a live
    restore drops the request in flight."""
    hook, calls, lags = _lag_recorder()
    cfg = with_trajectory_hook(_config(tiny_model, rollout_pipeline="one_step_off"), hook)
    algo = cfg.build_algo()
    try:
        for _ in range(2):
            algo.train()
        ckpt = algo.save_to_path(str(tmp_path / "ckpt"))  # batch 3 is in flight
        algo.train()
        uids_3 = sorted({t.uid for t in calls[-1][0]})
        assert set(lags[-1]) == {1}
    finally:
        algo.stop()

    algo = cfg.build_algo()
    try:
        algo.restore_from_path(ckpt)
        assert algo.algo_step == 2 and algo.policy_version == 2
        algo.train()
        assert sorted({t.uid for t in calls[-1][0]}) == uids_3, "the in-flight batch's tasks, sampled fresh"
        assert set(lags[-1]) == {0} and {t.policy_version for t in calls[-1][0]} == {2}
        # batch 4 is in flight: a restore of the live run (same version) drops it
        algo.restore_from_path(algo.save_to_path(str(tmp_path / "ckpt3")))
        algo.train()
        assert set(lags[-1]) == {0} and {t.policy_version for t in calls[-1][0]} == {3}
        r = algo.train()
        assert set(lags[-1]) == {1} and r["env_runners"]["policy_version_lag_max"] == 1
        assert algo.algo_step == 5 and r["dropped_stale_trajectories"] == 0
    finally:
        algo.stop()


def test_one_step_off_runner_killed_mid_sample(ray_session, tiny_model):
    """A runner killed while its request is in flight: the request is lost and counted, training
    goes on, the restarted runner is re-synced and samples again with lag <= 1."""
    ray = ray_session
    hook, calls, lags = _lag_recorder()
    state = {"killed": None}

    def kill_during_second_iteration(trajs, stats, algorithm):
        hook(trajs, stats, algorithm)
        if len(calls) == 2:  # batch 3 was just launched and is sampling now
            (wid, actor), *_ = sorted(algorithm.env_runner_group._worker_manager.actors().items())
            state["killed"] = wid
            ray.kill(actor, no_restart=False)

    cfg = (with_trajectory_hook(_config(tiny_model, rollout_pipeline="one_step_off"), kill_during_second_iteration)
           .fault_tolerance(restart_failed_env_runners=True, delay_between_env_runner_restarts_s=0))
    algo = cfg.build_algo()
    try:
        results = [algo.train() for _ in range(3)]  # the third collects the batch the kill hit
        assert state["killed"] is not None
        actor = algo.env_runner_group._worker_manager.actors()[state["killed"]]
        for _ in range(300):  # until Ray has restarted the actor (it reloads its model)
            try:
                ray.get(actor.ping.remote(), timeout=10)
                break
            except Exception:
                time.sleep(1)
        # the next iteration's restore_env_runners brings it back and re-syncs it; the batch after
        # that is sampled by both runners again
        results += [algo.train() for _ in range(2)]
        print("\nlost", [r.get("lost_env_runner_samples") for r in results],
              "dropped", [r.get("dropped_stale_trajectories") for r in results],
              "runner stats per batch", [len(s) for _, s in calls], "lags", [sorted(set(g)) for g in lags])
        # a sum metric not logged in an iteration reads nan there
        assert math.fsum(v for r in results if (v := r.get("lost_env_runner_samples", 0)) == v) >= 1
        assert all("dropped_stale_trajectories" in r for r in results)
        assert all(max(g, default=0) <= 1 for g in lags)
        assert len(calls[-1][1]) == 2, "the restarted runner samples again"
        assert algo.env_runner_group.num_healthy_remote_workers() == 2
    finally:
        algo.stop()
