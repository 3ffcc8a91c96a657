"""A CPU-offloaded FSDP2 learner through RLlib (``.learners(sharding="fsdp", cpu_offload=True)``,
bf16 mixed precision, a KL reference model): the learner holds the reference in bf16, steps its
offloaded shards with the fused AdamW kernel, and trains. The process-group half of offloading
(a CPU backend beside NCCL) needs GPU learners to matter: tests/models/test_cpu_offload.py checks
it on two gloo ranks without a CPU backend."""
from __future__ import annotations

import math

import rllib_spear  # noqa: F401  (registers the algorithms)
from rllib_spear import SPEARConfig

from e2e_helpers import small_config


def test_offloaded_fsdp_learner_with_a_bf16_reference_trains(ray_session, tiny_model):
    cfg = (small_config(SPEARConfig, tiny_model, kl_coeff=0.01, micro_batch_token_budget=256)
           .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.25)
           .resources(num_cpus_for_main_process=0.25)
           .learners(num_learners=1, num_cpus_per_learner=1, sharding="fsdp", cpu_offload=True,
                     mixed_precision="bf16"))

    def learner_facts(learner) -> dict:  # nested: cloudpickle ships it to the learner actor by value
        import torch
        from torch.distributed.tensor import DTensor

        from rllib_spear.learner.optim import adamw_implementation

        def local(p):
            return p.to_local() if isinstance(p, DTensor) else p

        ref = learner.layout.reference
        policy = [p for mid in learner.module.keys() for p in learner.module[mid].parameters()]
        return {
            "ref_dtypes": sorted({str(local(p).dtype) for p in ref.parameters()}),
            "ref_sharded": all(isinstance(p, DTensor) for p in ref.parameters()),
            "policy_dtypes": sorted({str(local(p).dtype) for p in policy}),
            "policy_devices": sorted({local(p).device.type for p in policy}),
            "adamw": sorted({adamw_implementation(o) for o in learner.all_optimizers()}),
            "threads": torch.get_num_threads(),
        }

    algo = cfg.build_algo()
    try:
        (facts,) = [r.get() for r in algo.learner_group.foreach_learner(learner_facts).result_or_errors]
        assert facts["ref_dtypes"] == ["torch.bfloat16"] and facts["ref_sharded"]
        assert facts["policy_dtypes"] == ["torch.float32"]  # fp32 master shards
        assert facts["policy_devices"] == ["cpu"]
        assert facts["adamw"] == ["fused"]
        assert facts["threads"] == 1  # num_cpus_per_learner=1
        stats = algo.train()["learners"]["default_policy"]
        assert math.isfinite(stats["grad_norm"]) and stats["num_optimizer_steps"] >= 1
        assert math.isfinite(stats["kl_ref"]) and stats["kl_ref"] >= 0
    finally:
        algo.stop()
