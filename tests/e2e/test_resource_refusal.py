"""A config whose actors the Ray cluster can never hold fails at once, naming the knobs, instead
of waiting forever (cluster/resource_check.py, docs/design.md "Fault tolerance"); one
that fits is not refused. On the session's Ray instance of 2 CPUs (conftest.py)."""
from __future__ import annotations

import time

import pytest

import rllib_spear  # noqa: F401  (registers the algorithms)
from rllib_spear import GRPOConfig

from e2e_helpers import small_config


def test_the_issue_example_fails_fast_naming_the_knobs(ray_session, tiny_model):
    """Issue 31: `.learners(num_learners=2, sharding="fsdp")` plus a runner on
    `ray.init(num_cpus=2)` waited 3 minutes without a first iteration."""
    assert ray_session.cluster_resources().get("CPU") == 2.0
    cfg = (GRPOConfig().learners(num_learners=2, sharding="fsdp")
           .env_runners(num_env_runners=1)
           .rl_module(model_config={"model_path": tiny_model}))
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="can never all start") as info:
        cfg.build_algo()
    assert time.perf_counter() - t0 < 60
    msg = str(info.value)
    for knob in ("3 CPU", "has 2", "num_learners=2", "num_cpus_per_learner=1", "num_env_runners=1",
                 "num_cpus_per_env_runner=1", "ray.init(num_cpus=...)"):
        assert knob in msg, knob
    # nothing was left behind holding the CPUs: the whole cluster is free again
    assert ray_session.available_resources().get("CPU") == 2.0


def test_a_config_that_fits_is_not_refused(ray_session, tiny_model):
    cfg = small_config(GRPOConfig, tiny_model).env_runners(num_cpus_per_env_runner=0.5)
    algo = cfg.build_algo()
    try:
        assert algo.env_runner_group.num_healthy_remote_workers() == 1
    finally:
        algo.stop()
