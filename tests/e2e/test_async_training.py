"""Fully asynchronous training (``rollout_pipeline="async"``, docs/design.md "Fully asynchronous
training"): SPEAR trains with runners that sample without pause, every kept trajectory is at most
``max_policy_lag`` iterations old (its oldest segment), and a restore drops what was in flight and
samples the outstanding tasks again, fresh."""
from __future__ import annotations

import torch

import rllib_spear  # noqa: F401  (registers the algorithms)
from rllib_spear import SPEARConfig

from e2e_helpers import recorder, small_config, with_trajectory_hook

SIL_KEYS = {"sil_size", "sil_added", "sil_replay_events", "sil_weight"}


def _config(tiny_model, num_env_runners=2, lag=2, **training):
    return (small_config(SPEARConfig, tiny_model, rollout_pipeline="async", max_policy_lag=lag,
                         sil_enabled=True, **training)
            .env_runners(num_env_runners=num_env_runners, num_cpus_per_env_runner=0.5, rollout_mode="async")
            .resources(num_cpus_for_main_process=0.5))


def _age_recorder():
    """(hook, calls, ages): records each batch and, per trajectory, the versions of its segments
    and its age in learner versions (the learner's version now - its oldest segment's)."""
    record, calls = recorder(synthetic_rewards=True)
    ages = []

    def hook(trajs, stats, algorithm):
        record(trajs, stats, algorithm)
        ages.append([(t.segment_versions, algorithm.policy_version - t.policy_version) for t in trajs])

    return hook, calls, ages


def _weights(algo):
    from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE

    state = algo.learner_group.get_state(components=COMPONENT_LEARNER + "/" + COMPONENT_RL_MODULE)
    (sd,) = state[COMPONENT_LEARNER][COMPONENT_RL_MODULE].values()
    return {k: torch.as_tensor(v).clone() for k, v in sd.items()}


def test_spear_trains_three_iterations_fully_async(ray_session, tiny_model):
    hook, calls, ages = _age_recorder()
    algo = with_trajectory_hook(_config(tiny_model), hook).build_algo()
    try:
        assert algo.config.policy_loss_config().tis_cap == 2.0, "async turns the truncated IS weight on"
        w0 = _weights(algo)
        results = [algo.train() for _ in range(3)]
        assert algo.algo_step == 3
        for r, (trajs, stats), batch_ages in zip(results, calls, ages):
            assert len(trajs) == 8 and len({t.uid for t in trajs}) == 2, "two whole groups of 4"
            assert stats, "the runners' stream windows reach the metrics"
            # one learner update per iteration (joint SIL), so versions count iterations
            assert all(0 <= age <= 2 for _, age in batch_ages), batch_ages
            assert all(None not in versions and versions == sorted(versions) for versions, _ in batch_ages)
            env = r["env_runners"]
            assert env["policy_lag_max"] <= 2 and "reward_total_mean" in env and "episode_return_mean" in env
            assert SIL_KEYS <= set(r["spear"]), SIL_KEYS - set(r["spear"])
            assert r["async"]["groups_outstanding"] <= 4, "in flight during the update: k x tasks_per_iteration"
            assert "dropped_stale_trajectories" in r and "lost_env_runner_samples" in r
        assert max(age for batch in ages for _, age in batch) >= 1, "later batches were sampled during training"
        assert any(not torch.equal(w0[k], v) for k, v in _weights(algo).items()), "the learner trained"
        print("\nsegment versions / ages per batch:", ages)
    finally:
        algo.stop()


def test_async_local_runner_and_restore_drop_in_flight_work(ray_session, tiny_model, tmp_path):
    """With the driver's own runner (no remote ones) the stream samples on the agent loop's thread
    while the driver trains. A checkpoint keeps the outstanding tasks; the restored run samples
    them again, from scratch, on the restored weights: nothing sampled before the restore is
    trained on."""
    hook, calls, ages = _age_recorder()
    cfg = with_trajectory_hook(_config(tiny_model, num_env_runners=0, lag=1), hook)
    algo = cfg.build_algo()
    try:
        for _ in range(2):
            algo.train()
        state = algo.get_state()["rllib_spear"]
        outstanding = [o["task"]["uid"] for o in state["pipeline"]["outstanding"]]
        assert len(outstanding) == 2, "k x tasks_per_iteration groups stay in flight during the update"
        ckpt = algo.save_to_path(str(tmp_path / "ckpt"))
        algo.train()
    finally:
        algo.stop()

    algo = cfg.build_algo()
    try:
        algo.restore_from_path(ckpt)
        assert algo.algo_step == 2 and algo.policy_version == 2
        r = algo.train()
        trajs = calls[-1][0]
        # the outstanding tasks were submitted again (first, with new ones filling the window):
        # each is trained in this batch or still outstanding, whichever groups finished first;
        # every trajectory is new: sampled from version 2 on
        still = {o["task"]["uid"] for o in algo.get_state()["rllib_spear"]["pipeline"]["outstanding"]}
        assert set(outstanding) <= {t.uid for t in trajs} | still, (outstanding, [t.uid for t in trajs], still)
        assert all(min(t.segment_versions) >= 2 for t in trajs)
        # a restore of the live run drops the groups in flight and counts them
        algo.restore_from_path(algo.save_to_path(str(tmp_path / "ckpt3")))
        r = algo.train()
        assert r["dropped_in_flight_trajectories"] > 0
        assert all(min(t.segment_versions) >= 3 for t in calls[-1][0])
        assert algo.algo_step == 4
    finally:
        algo.stop()
