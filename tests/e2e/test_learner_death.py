"""A learner rank that dies fails the iteration loudly, naming the rank and the way out (Tune
restarts the trial from its last checkpoint: docs/design.md "Fault tolerance"), for DDP and FSDP on
CPU (gloo), instead of surfacing a raw collective error of the surviving rank."""
from __future__ import annotations

import pytest

import rllib_spear  # noqa: F401  (registers the algorithms)
from rllib_spear import SPEARConfig
from rllib_spear.learner.failure import LearnerRankDied, dead_learner_ranks

from e2e_helpers import small_config


@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_a_dead_learner_rank_fails_the_iteration_naming_it(ray_session, tiny_model, sharding):
    ray = ray_session
    cfg = (small_config(SPEARConfig, tiny_model, sil_enabled=False)
           .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.25)
           .resources(num_cpus_for_main_process=0.25)
           .learners(num_learners=2, num_cpus_per_learner=0.5))
    if sharding == "fsdp":
        cfg = cfg.learners(sharding="fsdp")
    algo = cfg.build_algo()
    try:
        algo.train()
        assert dead_learner_ranks(algo.learner_group) == []
        ids = algo.learner_group._worker_manager.actor_ids()
        ray.kill(algo.learner_group._worker_manager.actors()[ids[1]], no_restart=True)
        with pytest.raises(LearnerRankDied, match=r"(?s)learner rank\(s\) \[1\] died.*max_failures"):
            algo.train()
        assert algo.algo_step == 1, "the failed iteration did not count"
    finally:
        algo.stop()
