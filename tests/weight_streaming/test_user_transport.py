"""A weight-sync transport of a user's own, written and registered in this file and named in the
config (``.learners(weight_sync_transport="whole_state")``): the library takes it as it takes its
built-in ones, with no change to any library file. It trains a tiny GRPO run end to end, and it
keeps the transport contract (``rllib_spear.testing.check_transport_contract``)."""
from __future__ import annotations

import os
import sys

import pytest
import ray.cloudpickle
import torch

from rllib_spear.testing import check_transport_contract
from rllib_spear.weight_streaming import TRANSPORTS, Transport, WeightReceiver, WeightSender, register_transport

# The learners and runners get the transport's class with the driver's calls: by value, since
# this module is not importable there.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

_RAY_INIT = dict(num_cpus=2, include_dashboard=False,
                 runtime_env={"env_vars": {"GLOO_SOCKET_IFNAME": "lo", "RAY_AUTH_MODE": "disabled"}})


class WholeStateSender(WeightSender):
    """Learner rank 0 puts all its inference weights, in the engines' dtype, as one Ray object."""

    _bytes: int | None = None

    def put(self, engine_dtype: str | None):
        import ray

        weights = self.weights
        tensors = dict(weights.iter(engine_dtype=engine_dtype))  # unsharded: rank 0 gets them all
        if weights.rank() != 0:
            return None
        self._bytes = sum(t.numel() * t.element_size() for t in tensors.values())
        return weights.version(), ray.put(tensors)

    def sent_bytes(self) -> int | None:
        return self._bytes


class WholeStateReceiver(WeightReceiver):
    """A runner loads the whole object into its engine, then takes the version."""

    def load(self, version: int, ref) -> int:
        import ray

        weights = self.weights
        weights.settle()
        tensors = ray.get(ref)
        with weights.updating():
            weights.engine.load_weights_stream(iter(tensors.items()))
            weights.engine.version = version
        weights.version = version
        return weights.version


class WholeStateTransport(Transport):
    """One object for every runner, through the object store (no buckets)."""

    sender = WholeStateSender
    receiver = WholeStateReceiver

    def sync(self, placement):
        cls, dtype = type(self), placement.engine_dtype()
        version, ref = placement.on_senders(cls, lambda s: s.put(dtype))
        return placement.on_receivers(cls, lambda r: r.load(version, ref)), version


@pytest.fixture(scope="module")
def algo():
    import ray

    from rllib_spear import GRPOConfig
    from rllib_spear.models.factory import tiny_model_path

    register_transport("whole_state", WholeStateTransport)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(**_RAY_INIT)
    cfg = (GRPOConfig().environment("search_qa")
           .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5, max_new_tokens=16, max_turns=2,
                        max_model_len=512, max_response_tokens=256, engine_kwargs={"dtype": "bfloat16"})
           .training(group_size=4, tasks_per_iteration=2, lr=1e-4, response_filters=(),
                     group_filter_keep_fraction=None)
           .learners(weight_sync_transport="whole_state")
           .rl_module(model_config={"model_path": tiny_model_path()})
           .fault_tolerance(restart_failed_env_runners=True, delay_between_env_runner_restarts_s=0)
           .debugging(seed=0))
    built = cfg.build_algo()
    try:
        yield built
    finally:
        built.stop()
        ray.shutdown()
        TRANSPORTS.unregister("whole_state")


def _learner_weights(algo):
    results = algo.learner_group.foreach_learner(lambda l: l.weight_senders.weights.state())
    state = next(s for s in (r.get() for r in results.result_or_errors) if s is not None)
    (sd,) = state["rl_module"].values()
    return {k: torch.as_tensor(v) for k, v in sd.items()}


def _runner_engine(runner):
    sd = {k: v.detach().clone() for k, v in runner.engine.model.state_dict().items()}
    return runner.weights_version, runner.engine.version, sd


def test_a_users_transport_trains_a_grpo_run(algo):
    assert algo.weight_sync.transport == "whole_state"
    algo.train()  # sample, update, then the sync through the user's transport
    version = next(r.get() for r in algo.learner_group.foreach_learner(
        lambda l: l.weight_senders.weights.version()).result_or_errors)
    assert version >= 1
    want = _learner_weights(algo)
    (runner_version, engine_version, sd), = algo.env_runner_group.foreach_env_runner(
        _runner_engine, local_env_runner=False)
    assert runner_version == engine_version == version
    assert all(sd[k].dtype == torch.bfloat16 and torch.equal(sd[k], v.to(torch.bfloat16)) for k, v in want.items())
    sent = next(b for b in (r.get() for r in algo.learner_group.foreach_learner(
        lambda l: l.weight_senders.of("whole_state").sent_bytes()).result_or_errors) if b is not None)
    assert sent * 2 == sum(v.numel() * v.element_size() for v in want.values())  # bf16 on the wire


def test_a_users_transport_keeps_the_transport_contract(algo):
    check_transport_contract("whole_state", algo)
