"""The resource check GRPO.setup runs before any actor starts (cluster/resource_check.py,
docs/design.md "Fault tolerance"): a pure function of (config, cluster totals), no Ray needed."""
from __future__ import annotations

import pytest

from rllib_spear import GRPOConfig
from rllib_spear.cluster import resource_check as rc
from rllib_spear.cluster.resource_check import check_resources, learner_cpus, resource_demands


def _issue_example():
    """The issue's config: two FSDP learners and a runner (tried on ray.init(num_cpus=2))."""
    return GRPOConfig().learners(num_learners=2, sharding="fsdp").env_runners(num_env_runners=1)


def test_the_issue_example_is_refused_naming_the_knobs():
    why = check_resources(_issue_example(), {"CPU": 2.0})
    assert why is not None
    assert "3 CPU" in why and "has 2" in why
    for knob in ("num_env_runners=1", "num_cpus_per_env_runner=1", "num_learners=2", "num_cpus_per_learner=1",
                 "ray.init(num_cpus=...)"):
        assert knob in why, knob


def test_configs_that_fit_are_not_refused():
    assert check_resources(_issue_example(), {"CPU": 3.0}) is None
    # one runner and one learner on 2 CPUs (the e2e suites' shape); the driver holds no Ray CPU
    assert check_resources(GRPOConfig().learners(num_learners=1), {"CPU": 2.0}) is None
    # everything in the driver: no actor at all
    local = GRPOConfig().env_runners(num_env_runners=0).learners(num_learners=0)
    assert resource_demands(local) == [] and check_resources(local, {}) is None


def test_gpus_are_counted_and_colocated_pairs_share_one():
    cfg = (GRPOConfig().env_runners(num_env_runners=2, num_gpus_per_env_runner=1)
           .learners(num_learners=2, num_gpus_per_learner=1))
    why = check_resources(cfg, {"CPU": 16.0, "GPU": 2.0})
    assert "4 GPU" in why and "num_gpus_per_env_runner=1" in why and "num_gpus_per_learner=1" in why
    assert "colocate=True" in why  # the fix that fits this shape on 2 GPUs
    colocated = (GRPOConfig().env_runners(num_env_runners=2, num_gpus_per_env_runner=1, engine="vllm")
                 .learners(num_learners=2, num_gpus_per_learner=1).resources(colocate=True))
    colocated.validate(check_files=False)  # splits each GPU 0.49 / 0.51
    assert check_resources(colocated, {"CPU": 16.0, "GPU": 2.0}) is None
    assert "GPU" in check_resources(colocated, {"CPU": 16.0, "GPU": 1.0})


def test_learner_cpus_follow_rllib_auto_rule():
    assert learner_cpus(GRPOConfig().learners(num_learners=2)) == 1.0
    assert learner_cpus(GRPOConfig().learners(num_learners=2, num_gpus_per_learner=1)) == 0.0
    assert learner_cpus(GRPOConfig().learners(num_learners=2, num_cpus_per_learner=3)) == 3.0


def test_each_actor_must_fit_on_one_node():
    cfg = GRPOConfig().env_runners(num_env_runners=1, num_gpus_per_env_runner=4).learners(num_learners=0)
    nodes = [{"CPU": 8.0, "GPU": 2.0}, {"CPU": 8.0, "GPU": 2.0}]
    assert check_resources(cfg, {"CPU": 16.0, "GPU": 4.0}) is None  # the totals alone fit
    why = check_resources(cfg, {"CPU": 16.0, "GPU": 4.0}, nodes)
    assert "each env runner needs 4 GPU on one node" in why and "largest node has 2" in why


def test_custom_resources_are_checked():
    cfg = GRPOConfig().env_runners(num_env_runners=2, custom_resources_per_env_runner={"sandbox": 1})
    assert "sandbox" in check_resources(cfg, {"CPU": 8.0, "sandbox": 1.0})
    assert check_resources(cfg, {"CPU": 8.0, "sandbox": 2.0}) is None


def test_cluster_check_refuses_warns_or_skips(monkeypatch, caplog):
    """The Ray side: refuse on a fixed cluster, warn where it autoscales, skip under a placement
    group (a Tune trial reserved the same actors' resources before setup ran)."""
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(rc, "_node_totals", lambda: [{"CPU": 2.0}])
    monkeypatch.setattr(rc, "_in_placement_group", lambda: False)
    monkeypatch.setattr(rc, "_can_autoscale", lambda: False)
    with pytest.raises(ValueError, match="can never all start"):
        rc.check_cluster_fits(_issue_example())
    rc.check_cluster_fits(GRPOConfig().learners(num_learners=1))  # fits

    monkeypatch.setattr(rc, "_can_autoscale", lambda: True)
    with caplog.at_level("WARNING"):
        rc.check_cluster_fits(_issue_example())
    assert "autoscaler" in caplog.text

    monkeypatch.setattr(rc, "_can_autoscale", lambda: False)
    monkeypatch.setattr(rc, "_in_placement_group", lambda: True)
    rc.check_cluster_fits(_issue_example())  # Tune: not judged here
