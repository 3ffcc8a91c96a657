"""A local run (no runner / learner actors) starts Ray without the dashboard and with one CPU
slot; a user's Ray, or a cluster address, is left alone."""
from __future__ import annotations

import pytest
import ray
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

from rllib_spear import SPEARConfig
from rllib_spear.cluster import local_ray


@pytest.fixture
def calls(monkeypatch):
    seen: list[dict] = []
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.append(kw))
    return seen


def _local():
    return SPEARConfig().env_runners(num_env_runners=0)


def test_local_run_gets_no_dashboard_and_one_cpu(calls):
    assert local_ray.init_ray(_local()) is True
    assert calls == [{"include_dashboard": False, "num_cpus": 1}]


def test_run_with_actors_keeps_ray_resource_detection(calls):
    local_ray.init_ray(SPEARConfig().env_runners(num_env_runners=2))
    local_ray.init_ray(_local().learners(num_learners=2))
    assert calls == [{"include_dashboard": False}, {"include_dashboard": False}]


def test_user_kwargs_win(calls):
    local_ray.init_ray(_local(), include_dashboard=True, num_cpus=4)
    assert calls == [{"include_dashboard": True, "num_cpus": 4}]


def test_running_ray_or_cluster_address_is_left_alone(calls, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert local_ray.init_ray(_local()) is False
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    assert local_ray.init_ray(_local()) is False
    assert calls == []


def test_build_algo_starts_ray_lean_before_building(calls, monkeypatch):
    order = []
    monkeypatch.setattr(ray, "init", lambda **kw: order.append(("init", kw)))
    monkeypatch.setattr(AlgorithmConfig, "build_algo", lambda self, *a, **k: order.append(("build", None)) or "algo")
    assert _local().build_algo() == "algo"
    assert order == [("init", {"include_dashboard": False, "num_cpus": 1}), ("build", None)]
