"""Transport "vllm" on a Ray cluster (docs/design.md "The vLLM transport"): vLLM's own
weight-transfer API with the gloo backend, the default for vLLM engines. After each training
iteration the engines' log-probs equal the learner's re-scoring; FSDP learners send gathered
weights; a restarted runner rejoins a new transfer group; the wire carries the engine's dtype."""
from __future__ import annotations

import os
import sys

import pytest
import ray.cloudpickle

from e2e_helpers import small_config

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.vllm

SEQ = list(range(3, 40))


def _require_vllm():
    from rllib_spear.env_runners.engines.vllm_engine import vllm_available

    ok, why = vllm_available()
    if not ok:
        pytest.skip(why)


def _build(cfg):
    try:
        return cfg.build_algo()
    except Exception as e:  # pragma: no cover - depends on the machine
        if os.environ.get("RLLIB_SPEAR_REQUIRE_VLLM") == "1":
            raise
        pytest.skip(f"vLLM runner could not start here: {type(e).__name__}: {e}")


def _engine_scores(runner):
    return runner.weights_version, runner.engine.version, runner.weight_receivers.of("vllm").group_id(), \
        runner.engine.score([SEQ])[0]


def _learner_scores(state_dict, model_path, dtype="float32"):
    import torch
    from transformers import AutoModelForCausalLM

    from rllib_spear.models.logprobs import token_logprobs

    ref = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    ref.load_state_dict({k: v.float() for k, v in state_dict.items()}, strict=False)
    ref.tie_weights()
    ref.to(getattr(torch, dtype))
    ids = torch.tensor([SEQ])
    return token_logprobs(ref, ids, torch.ones_like(ids))[0].float().tolist()


def _gathered(algo):
    return next(s for s in (r.get() for r in algo.learner_group.foreach_learner(
        lambda l: l.weight_senders.weights.state()).result_or_errors) if s is not None)["rl_module"]["default_policy"]


def _max_gap(a, b):
    return max(abs(x - y) for x, y in zip(a[1:], b[1:]))


def test_default_transport_trains_two_runners_through_vllm_weight_transfer(ray_session, tiny_model):
    """engine='vllm' with the default transport: the runners' engines get every update through
    vLLM's weight-transfer API (one group, formed once), version-checked, and score exactly as
    the learner's weights do."""
    _require_vllm()
    from rllib_spear import GRPOConfig

    cfg = small_config(GRPOConfig, tiny_model).env_runners(num_env_runners=2, num_cpus_per_env_runner=0.5,
                                                           engine="vllm")
    algo = _build(cfg)
    try:
        assert algo.config.weight_sync_transport is None  # the default: "vllm" for vLLM engines
        groups = set()
        for it in range(2):
            algo.train()
            want = _learner_scores(_gathered(algo), tiny_model)
            v = algo.learner_group.foreach_learner(lambda l: l.weight_senders.weights.version()).result_or_errors[0].get()
            got = algo.env_runner_group.foreach_env_runner(_engine_scores, local_env_runner=False)
            assert len(got) == 2
            for runner_version, engine_version, gid, scores in got:
                assert runner_version == engine_version == v >= it + 1
                assert gid is not None
                groups.add(gid)
                assert _max_gap(scores, want) < 1e-4
        assert len(groups) == 1, "the transfer group is formed once and reused"
    finally:
        algo.stop()


def test_fsdp_learners_send_gathered_weights_in_the_engine_dtype(ray_session, tiny_model):
    """Two FSDP learners (fp32 master weights) and a bf16 engine: every rank gathers, rank 0 casts
    each tensor to bf16 and sends; the engine holds exactly the cast gathered weights, and the
    wire carried half the bytes of the fp32 state."""
    _require_vllm()
    import torch

    from rllib_spear import GRPOConfig

    cfg = (small_config(GRPOConfig, tiny_model)
           .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.25, engine="vllm",
                        engine_kwargs={"dtype": "bfloat16"})
           .learners(num_learners=2, num_cpus_per_learner=0.5, sharding="fsdp", weight_sync_transport="vllm",
                     weight_sync_bucket_mb=0.1)
           .resources(num_cpus_for_main_process=0.25))
    algo = _build(cfg)
    try:
        algo.train()
        want = _gathered(algo)
        fp32_bytes = sum(v.numel() * v.element_size() for v in want.values())
        sent = next(b for b in (r.get() for r in algo.learner_group.foreach_learner(
            lambda l: l.weight_senders.of("vllm").sent_bytes()).result_or_errors) if b is not None)
        # bf16 payload: half the fp32 bytes (plus at most 15 bytes of alignment per tensor)
        assert fp32_bytes / 2 <= sent <= fp32_bytes / 2 + 16 * len(want)

        def engine_state(runner):
            def read(worker):
                model = worker.model_runner.get_model()
                return {k: v.detach().clone() for k, v in model.state_dict().items()}

            return runner.weights_version, runner.engine.llm.collective_rpc(read)[0]

        (version, got), = algo.env_runner_group.foreach_env_runner(engine_state, local_env_runner=False)
        v = next(r.get() for r in algo.learner_group.foreach_learner(lambda l: l.weight_senders.weights.version()).result_or_errors)
        assert version == v
        # vLLM fuses q/k/v and gate/up; the unfused tensors (norms, embedding) compare directly
        emb = "model.embed_tokens.weight"
        assert got[emb].dtype == torch.bfloat16
        rows = want[emb].shape[0]  # vLLM pads the vocabulary rows
        assert torch.equal(got[emb][:rows], want[emb].to(torch.bfloat16))
        norm = "model.norm.weight"
        assert torch.equal(got[norm], want[norm].to(torch.bfloat16))
    finally:
        algo.stop()


def test_restarted_runner_rejoins_a_new_transfer_group(ray_session, tiny_model):
    _require_vllm()
    from rllib_spear import GRPOConfig

    cfg = (small_config(GRPOConfig, tiny_model)
           .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5, engine="vllm")
           .fault_tolerance(restart_failed_env_runners=True, delay_between_env_runner_restarts_s=0))
    algo = _build(cfg)
    try:
        algo.train()
        group = algo.env_runner_group
        (gid,) = group.foreach_env_runner(lambda r: r.weight_receivers.of("vllm").group_id(), local_env_runner=False)
        assert gid
        (_, old_actor), = group._worker_manager.actors().items()
        ray_session.kill(old_actor, no_restart=False)
        for _ in range(10):
            algo.train()  # must not raise: the restored runner is synced through a new group
            if group.num_healthy_remote_workers() == 1:
                break
        algo.train()
        want = _learner_scores(_gathered(algo), tiny_model)
        v = algo.learner_group.foreach_learner(lambda l: l.weight_senders.weights.version()).result_or_errors[0].get()
        (runner_version, engine_version, new_gid, scores), = group.foreach_env_runner(
            _engine_scores, local_env_runner=False)
        assert runner_version == engine_version == v
        assert new_gid and new_gid != gid
        assert _max_gap(scores, want) < 1e-4
    finally:
        algo.stop()
