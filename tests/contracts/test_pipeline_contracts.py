"""Contract tests of the driver's and the runners' schedules: every registered rollout pipeline
(rllib_spear/pipelines/registry.py) and rollout mode (env_runners/rollout_modes.py) through the
same ``rllib_spear.testing`` check; a pipeline or mode that breaks its contract is refused, naming
what is wrong."""
from __future__ import annotations

import pytest

from rllib_spear.env_runners.rollout_modes import (
    ROLLOUT_MODES, RolloutMode, TurnSyncMode, register_rollout_mode, rollout_mode_names,
)
from rllib_spear.pipelines import PIPELINES, SampledBatch, pipeline_names, register_pipeline
from rllib_spear.pipelines.sync import SyncPipeline
from rllib_spear.testing import ContractError, check_pipeline_contract, check_rollout_mode_contract


@pytest.mark.parametrize("name", pipeline_names())
def test_pipeline_contract(name):
    check_pipeline_contract(name)


@pytest.mark.parametrize("name", rollout_mode_names())
def test_rollout_mode_contract(name):
    check_rollout_mode_contract(name)


def test_the_registries_hold_the_built_ins_in_the_order_validate_lists_them():
    assert pipeline_names()[:3] == ["sync", "one_step_off", "async"]
    assert rollout_mode_names()[:2] == ["turn_sync", "async"]


@pytest.fixture
def registered():
    """Register test pieces; unregistered after the test."""
    added = []

    def add(registry, name, decorator, cls):
        decorator(name)(cls)
        added.append((registry, name))
        return cls

    yield add
    for registry, name in added:
        registry.unregister(name)


def test_a_pipeline_that_splits_groups_is_refused(registered):
    class HalfGroups(SyncPipeline):
        def next_batch(self, host):
            batch = super().next_batch(host)
            return SampledBatch(batch.trajectories[::2], batch.runner_stats, batch.sampled_version, batch.counts)

    registered(PIPELINES, "half_groups", register_pipeline, HalfGroups)
    with pytest.raises(ContractError, match="whole groups"):
        check_pipeline_contract("half_groups")


def test_a_pipeline_that_forgets_its_in_flight_tasks_on_restore_is_refused(registered):
    from rllib_spear.pipelines.one_step_off import OneStepOffPipeline

    class Forgetful(OneStepOffPipeline):
        def checkpoint_sampler_state(self, sampler):
            return sampler.get_state()  # past the tasks in flight: a restore skips them

    registered(PIPELINES, "forgetful", register_pipeline, Forgetful)
    with pytest.raises(ContractError, match="trains .* next; the run that went on trained"):
        check_pipeline_contract("forgetful")


def test_a_rollout_mode_that_loses_the_policy_version_is_refused(registered):
    class Unstamped(TurnSyncMode):
        def build(self, **kwargs):
            rollout = super().build(**kwargs)
            run = rollout.run
            rollout.run = lambda tasks, group_size, policy_version=0: run(tasks, group_size, policy_version=0)
            return rollout

    registered(ROLLOUT_MODES, "unstamped", register_rollout_mode, Unstamped)
    with pytest.raises(ContractError, match="policy_version"):
        check_rollout_mode_contract("unstamped")


def test_registering_anything_but_a_subclass_is_a_type_error():
    with pytest.raises(TypeError, match="RolloutPipeline subclass"):
        register_pipeline("nope")(object)
    with pytest.raises(TypeError, match="RolloutMode subclass"):
        register_rollout_mode("nope")(object)
    assert "nope" not in PIPELINES and "nope" not in ROLLOUT_MODES and issubclass(TurnSyncMode, RolloutMode)
