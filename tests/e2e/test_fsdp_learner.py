"""FSDP2 learners (learners(sharding="fsdp")) against the single learner, on CPU over gloo.

Every comparison replays the same sampled trajectories (seeded synthetic rewards, so advantages
are not zero) through one optimizer step, then compares the learners' weights:

* fp32: 2 FSDP ranks == 1 learner to 1e-5 (the gradient of the global batch does not depend on
  the number of ranks or the micro-batch split);
* bf16 mixed precision: 2 FSDP ranks (bf16 gathered parameters, fp32 reduce) vs 1 learner under
  bf16 autocast. Both round differently from fp32 (FSDP casts every op's inputs, autocast only the
  matmuls), so the tolerance is the bf16 error itself: their difference must be no larger than
  twice the difference between the autocast learner and the fp32 learner, and small against the
  update;
* LoRA: 2 DDP ranks and 2 FSDP ranks == 1 learner to 1e-5 on the merged weights;
* resume: a 2-rank checkpoint restored on 2 ranks gives the same next iteration (loss, grad norm,
  weights) as the run that never stopped, and restores on 1 learner (DCP re-shards on load).
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import rllib_spear  # noqa: F401  (registers the algorithms)
from rllib_spear import SPEARConfig

from e2e_helpers import replayer, small_config, with_trajectory_hook

LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.0}


def _config(tiny_model, num_learners, *, sharding="ddp", mixed_precision=None, lora=None, lr=1e-4):
    cfg = (small_config(SPEARConfig, tiny_model, sil_enabled=False, tool_reward_schedule="none",
                        loss_mode="vanilla", entropy_coeff=0.0, lr=lr,
                        micro_batch_token_budget=256)  # several micro-batches per rank
           .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.25)
           .resources(num_cpus_for_main_process=0.25))
    if lora:
        cfg = cfg.rl_module(model_config={"model_path": tiny_model, "lora": lora})
    cfg = cfg.learners(sharding=sharding, mixed_precision=mixed_precision)
    if num_learners:
        cfg = cfg.learners(num_learners=num_learners, num_cpus_per_learner=0.5)
    return cfg


def _weights(algo) -> dict[str, torch.Tensor]:
    """The learners' inference weights (gathered from the shards under FSDP)."""
    results = algo.learner_group.foreach_learner(lambda learner: learner.weight_senders.weights.state())
    states = [r.get() for r in results.result_or_errors]
    state = next(s for s in states if s is not None)
    (mod,) = state["rl_module"].values()
    return {k: torch.as_tensor(np.asarray(v)).clone() if not isinstance(v, torch.Tensor) else v.clone()
            for k, v in mod.items()}


def _diff(a, b) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _rel(a, b, ref) -> float:
    """||a - b|| / ||ref|| over all tensors."""
    num = sum(float(((a[k].double() - b[k].double()) ** 2).sum()) for k in a)
    den = sum(float((ref[k].double() ** 2).sum()) for k in ref)
    return (num / den) ** 0.5


def _synthetic(trajs):
    rng = np.random.default_rng(123)
    for t in trajs:
        t.outcome_reward = float(rng.choice([0.0, 0.25, 1.0]))
    return trajs


@pytest.fixture(scope="module")
def recorded(ray_session, tiny_model):
    """One sampled batch (seeded synthetic rewards) and the weights before any update."""
    algo = _config(tiny_model, 0).build_algo()
    try:
        init = _weights(algo)
        trajs, stats = algo.sample(algo.task_sampler.next(algo.config.tasks_per_iteration))
        assert trajs
    finally:
        algo.stop()
    return {"init": init, "trajs": _synthetic(trajs), "stats": stats}


def _one_step(cfg, recorded, *, check_init=True):
    """Build, replay the recorded batch through one training iteration, return weights + result."""
    hook, _ = replayer((recorded["trajs"], recorded["stats"]))
    algo = with_trajectory_hook(cfg, hook).build_algo()
    try:
        if check_init:
            w0 = _weights(algo)
            if "lora" not in cfg.model_config:
                assert _diff(recorded["init"], w0) == 0.0
        result = algo.train()
        return _weights(algo), result["learners"]["default_policy"]
    finally:
        algo.stop()


@pytest.fixture(scope="module")
def single_fp32(recorded, tiny_model):
    return _one_step(_config(tiny_model, 0), recorded)


def test_fsdp_two_ranks_fp32_equals_single_learner(recorded, single_fp32, tiny_model):
    w1, r1 = single_fp32
    w2, r2 = _one_step(_config(tiny_model, 2, sharding="fsdp"), recorded)
    moved, diff = _diff(recorded["init"], w1), _diff(w1, w2)
    print(f"\nfp32: grad_norm 1 learner {r1['grad_norm']:.6g} vs 2 FSDP ranks {r2['grad_norm']:.6g}; "
          f"max |param diff| {diff:.3g} (step {moved:.3g})")
    assert moved > 1e-6
    assert r2["grad_norm"] == pytest.approx(r1["grad_norm"], rel=1e-4)
    assert diff < 1e-5


def test_fsdp_bf16_mixed_precision_matches_autocast(recorded, single_fp32, tiny_model):
    w_fp32, _ = single_fp32
    w_auto, r_auto = _one_step(_config(tiny_model, 0, mixed_precision="bf16"), recorded)
    w_fsdp, r_fsdp = _one_step(_config(tiny_model, 2, sharding="fsdp", mixed_precision="bf16"), recorded)
    init = recorded["init"]
    update = {k: w_auto[k].double() - init[k].double() for k in init}
    fsdp_vs_auto = _rel(w_fsdp, w_auto, update)
    auto_vs_fp32 = _rel(w_auto, w_fp32, update)
    print(f"\nbf16: |fsdp - autocast| / |update| = {fsdp_vs_auto:.3g}; |autocast - fp32| / |update| = "
          f"{auto_vs_fp32:.3g}; grad_norm autocast {r_auto['grad_norm']:.6g} fsdp {r_fsdp['grad_norm']:.6g}")
    # master weights stay float32 under both
    assert all(v.dtype == torch.float32 for v in w_fsdp.values())
    assert fsdp_vs_auto <= max(2.0 * auto_vs_fp32, 1e-3)
    assert fsdp_vs_auto < 0.25
    assert r_fsdp["grad_norm"] == pytest.approx(r_auto["grad_norm"], rel=0.05)


@pytest.fixture(scope="module")
def single_lora(recorded, tiny_model):
    return _one_step(_config(tiny_model, 0, lora=LORA), recorded)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_lora_two_ranks_equal_single_learner(recorded, single_lora, tiny_model, strategy):
    w1, r1 = single_lora
    w2, r2 = _one_step(_config(tiny_model, 2, sharding=strategy, lora=LORA), recorded)
    moved, diff = _diff(recorded["init"], w1), _diff(w1, w2)
    print(f"\nLoRA {strategy}: grad_norm {r1['grad_norm']:.6g} vs {r2['grad_norm']:.6g}; max diff {diff:.3g} (step {moved:.3g})")
    assert moved > 1e-7
    assert r2["grad_norm"] == pytest.approx(r1["grad_norm"], rel=1e-4)
    assert diff < 1e-5


def _replaying(cfg, recorded, trajs2):
    """``cfg`` built with a hook that replays the recorded batch at iteration 1 and ``trajs2``
    from iteration 2 on (the hook travels in the checkpointed config, so a restored algorithm
    replays the same batches)."""
    batches = [recorded["trajs"], trajs2]

    def replay(trajs, stats, algorithm):
        step = algorithm.algo_step + 1
        trajs[:] = copy.deepcopy(batches[min(step, 2) - 1])
        stats[:] = copy.deepcopy(recorded["stats"])

    return with_trajectory_hook(cfg, replay).build_algo()


@pytest.fixture(scope="module")
def fsdp_run(recorded, tiny_model, tmp_path_factory):
    """2 FSDP ranks: iteration 1, checkpoint, iteration 2 (the uninterrupted run)."""
    trajs2 = _synthetic(copy.deepcopy(recorded["trajs"])[::-1])
    cfg = _config(tiny_model, 2, sharding="fsdp")
    algo = _replaying(cfg, recorded, trajs2)
    try:
        algo.train()
        ckpt = algo.save_to_path(str(tmp_path_factory.mktemp("fsdp") / "ckpt"))
        saved = _weights(algo)
        r2 = algo.train()["learners"]["default_policy"]
        w2 = _weights(algo)
    finally:
        algo.stop()
    return {"cfg": cfg, "ckpt": ckpt, "saved": saved, "r2": r2, "w2": w2, "trajs2": trajs2}


def test_fsdp_resume_is_identical_and_reshards(recorded, fsdp_run, tiny_model):
    """Kill after iteration 1, restore, iteration 2 identical; the 2-rank checkpoint restores on 1
    learner with the same weights and optimizer state."""
    from pathlib import Path

    ckpt, saved, r2, w2 = fsdp_run["ckpt"], fsdp_run["saved"], fsdp_run["r2"], fsdp_run["w2"]
    assert (Path(ckpt) / "learner_group" / "learner" / "sharded_state" / "default_policy").is_dir()
    assert not (Path(ckpt) / "learner_group" / "learner" / "rl_module").exists()  # no gathered copy

    from ray.rllib.algorithms.algorithm import Algorithm

    algo = Algorithm.from_checkpoint(ckpt)  # its config carries the replaying hook
    try:
        assert algo.config.sharding == "fsdp" and algo.config.num_learners == 2
        assert _diff(_weights(algo), saved) == 0.0
        assert algo.algo_step == 1
        r2b = algo.train()["learners"]["default_policy"]
        w2b = _weights(algo)
    finally:
        algo.stop()
    print(f"\nresume: loss {r2['total_loss']:.8g} vs {r2b['total_loss']:.8g}; grad_norm {r2['grad_norm']:.8g} "
          f"vs {r2b['grad_norm']:.8g}; max param diff {_diff(w2, w2b):.3g}")
    assert r2b["total_loss"] == r2["total_loss"]
    assert r2b["grad_norm"] == r2["grad_norm"]
    assert _diff(w2, w2b) == 0.0

    # N=2 -> M=1: a single (local, unsharded) learner loads the shards
    algo = _replaying(_config(tiny_model, 0), recorded, fsdp_run["trajs2"])
    try:
        algo.restore_from_path(ckpt)
        assert _diff(_weights(algo), saved) == 0.0
        r2c = algo.train()["learners"]["default_policy"]
        w2c = _weights(algo)
    finally:
        algo.stop()
    # the optimizer state came along: the next step matches the sharded run's
    assert _diff(w2, w2c) < 1e-5
    assert r2c["grad_norm"] == pytest.approx(r2["grad_norm"], rel=1e-4)


def test_replicated_checkpoint_restores_into_fsdp(recorded, fsdp_run, tiny_model, tmp_path):
    """A single-learner checkpoint (RLlib's own layout) loads into 2 FSDP ranks, optimizer state
    included: the next step matches the single learner's."""
    trajs2 = fsdp_run["trajs2"]
    algo = _replaying(_config(tiny_model, 0), recorded, trajs2)
    try:
        algo.train()
        ckpt = algo.save_to_path(str(tmp_path / "single"))
        saved = _weights(algo)
        r2 = algo.train()["learners"]["default_policy"]
        w2 = _weights(algo)
    finally:
        algo.stop()
    algo = _replaying(_config(tiny_model, 2, sharding="fsdp"), recorded, trajs2)
    try:
        algo.restore_from_path(ckpt)
        assert _diff(_weights(algo), saved) < 1e-7
        r2b = algo.train()["learners"]["default_policy"]
        w2b = _weights(algo)
    finally:
        algo.stop()
    assert r2b["grad_norm"] == pytest.approx(r2["grad_norm"], rel=1e-4)
    assert _diff(w2, w2b) < 1e-5


def test_export_sharded_checkpoint_to_hf_folder(fsdp_run, tmp_path):
    """`rllib-spear export` turns the 2-rank sharded checkpoint into a folder that transformers
    and vLLM load, holding the learner's weights."""
    import json
    import os
    import subprocess
    import sys

    from transformers import AutoModelForCausalLM

    from rllib_spear.cli import main

    out = tmp_path / "hf"
    assert main(["export", fsdp_run["ckpt"], str(out)]) == 0
    info = json.loads((out / "rllib_spear_export.json").read_text())
    assert info["source"].startswith("sharded") and info["weights_seq_no"] == 1
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    sd = model.state_dict()
    saved = fsdp_run["saved"]
    assert max(float((sd[k].float() - v.float()).abs().max()) for k, v in saved.items()) == 0.0
    # vLLM serves the exported folder with the same log-probs as transformers (own process: one
    # vLLM engine per process)
    script = f"""
import os, sys
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0"); os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
from rllib_spear.env_runners.engines.vllm_engine import vllm_available, VLLMEngine
from rllib_spear.env_runners.engines.hf_engine import HFEngine
ok, why = vllm_available()
if not ok:
    print("VLLM_UNAVAILABLE", why); sys.exit(0)
seq = list(range(5, 45))
hf = HFEngine({str(out)!r}).score([seq])[0]
eng = VLLMEngine({str(out)!r}, dtype="float32", seed=0, max_model_len=256)
vl = eng.score([seq])[0]
eng.shutdown()
gap = max(abs(a - b) for a, b in zip(hf[1:], vl[1:]))
print("VLLM_GAP", gap)
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if "VLLM_UNAVAILABLE" in res.stdout:
        if os.environ.get("RLLIB_SPEAR_REQUIRE_VLLM") == "1":
            pytest.fail(res.stdout)
        pytest.skip(res.stdout.strip())
    assert "VLLM_GAP" in res.stdout, res.stdout[-2000:] + res.stderr[-4000:]
    gap = float(res.stdout.split("VLLM_GAP")[1].split()[0])
    print(f"\nexported model: vLLM vs transformers max |logp gap| {gap:.3g}")
    assert gap < 1e-3
