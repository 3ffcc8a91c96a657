"""CPU offload of FSDP2 learners (docs/design.md "Learner sharding"), checked on CPU over gloo.

GPU learners get Ray Train's NCCL-only group ("cuda:nccl"): a collective on a CPU-offloaded shard
(the weights' gather, the global gradient norm) finds no backend for CPU tensors. Here the
default group is started as "cuda:gloo", which has no CPU backend either; on a CPU machine the
FSDP mesh is a CPU mesh, so *every* FSDP collective meets the missing backend (on GPUs only the
ones on CPU shards do), which makes the failure and its fix visible without a GPU:

* the backend an offloading learner's mesh gets (``sharding.offload_group_backend``);
* two ranks sharding a tiny Qwen2 with ``cpu_offload=True`` on ``sharding.offload_mesh``: they
  train (forward, backward, global norm, clipping, fused AdamW on the CPU shards) like one
  unsharded learner with torch's default AdamW, while fully_shard's default mesh fails;
* the bf16 reference model: exactly the log-probs of a float32 copy under FSDP's bf16 policy, and
  within bf16 rounding of the float32 model under autocast;
* the learner's thread count (``num_cpus_per_learner``), and the warning of validate() when GPU
  learners offload with no CPU reserved.

Not checked here (no GPU): that ``sharding.full_tensor`` and ``sharding.global_grad_norm`` take
their offloaded paths (a shard off its mesh's device, which a CPU mesh never has) and run their
collectives over NCCL; the pieces of those paths are checked on CPU shards (the rewrap on an
uneven shard, the norm of the shards against torch's).
"""
from __future__ import annotations

import logging
import os
import socket
import types

import pytest
import torch

from rllib_spear.learner.module_layout import ModuleLayout, reference_model
from rllib_spear.learner.optim import adamw_implementation, build_adamw
from rllib_spear.models import sharding
from rllib_spear.models.threads import learner_torch_threads

NO_CPU_BACKEND = "No backend type associated with device type cpu"
WORLD = 2
STEPS = 2
LR, BETAS, WD, CLIP = 1e-3, (0.9, 0.999), 0.01, 1.0


# ------------------------------------------------------------------------------------- backends
@pytest.mark.parametrize("default, expected", [
    ("nccl", "cpu:gloo,cuda:nccl"),  # Ray Train's choice for GPU learners
    ("cuda:nccl", "cpu:gloo,cuda:nccl"),  # the same group as dist.get_backend_config() writes it
    ("cuda:gloo", "cpu:gloo,cuda:gloo"),  # the CPU stand-in of this file
    ("gloo", None),  # CPU learners: gloo serves CPU tensors already
    ("cpu:gloo,cuda:gloo", None),
    ("cpu:gloo,cuda:nccl", None),
])
def test_offload_group_backend_puts_gloo_beside_nccl(default, expected):
    assert sharding.offload_group_backend(default, cpu_offload=True) == expected
    assert sharding.offload_group_backend(default, cpu_offload=False) is None


def test_offload_mesh_without_a_process_group_is_the_default():
    assert sharding.offload_mesh("cpu", cpu_offload=True) is None  # no group: nothing to shard over


# --------------------------------------------------------------------------- two gloo ranks
def _batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (3, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 18:] = 0  # a padded row
    weights = torch.randn(ids.shape, generator=g)  # a loss whose gradient reaches every weight
    return ids, mask, weights


def _train(lm, opt, ids, mask, weights) -> list[float]:
    """STEPS optimizer steps of the learner's update (global norm, global-norm clipping)."""
    from rllib_spear.models.logprobs import token_logprobs

    norms = []
    for _ in range(STEPS):
        logp = token_logprobs(lm, ids, mask)
        (logp.float() * weights[:, :logp.shape[1]]).mean().backward()
        params = [p for p in lm.parameters() if p.grad is not None]
        norm = sharding.global_grad_norm([p.grad for p in params])
        norms.append(float(norm))
        sharding.clip_grads_(params, CLIP, norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return norms


def _layout(mixed_precision: str | None) -> ModuleLayout:
    """The module layout a sharded, offloading GRPO learner holds (learner/module_layout.py)."""
    return ModuleLayout(types.SimpleNamespace(sharding="fsdp", cpu_offload=True, mixed_precision=mixed_precision),
                        torch.device("cpu"))


def _rank(rank: int, port: int, model_path: str, out_dir: str) -> None:
    """One learner rank (torch.multiprocessing.spawn): writes its findings to out_dir."""
    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor
    from transformers import AutoModelForCausalLM

    from rllib_spear.models.logprobs import token_logprobs

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    # no CPU backend, as Ray Train's "nccl" for GPU learners
    dist.init_process_group("cuda:gloo", rank=rank, world_size=WORLD)
    # Every rank reads the weights itself: rank 0's broadcast runs on the default group, which
    # here has no CPU backend (on GPUs it is NCCL, and torch stages the broadcast on the GPU).
    sharding.load_full_state_from_rank0 = lambda model, full, device: None
    out: dict = {}
    try:
        out["default_backend"] = dist.get_backend_config()
        learner = _layout(None)
        mesh = learner.mesh()
        out["mesh_backend"] = dist.get_backend_config(mesh.get_group())
        out["mesh_once"] = learner.mesh() is mesh
        lm = AutoModelForCausalLM.from_pretrained(model_path)
        ids, mask, weights = _batch(lm.config.vocab_size)
        learner.shard_from_rank0(lm)  # the learner's own sharding call
        out["sharded"] = sharding.is_sharded(lm)
        out["on_mesh"] = all(p.device_mesh is mesh for p in lm.parameters())
        opt = build_adamw([p for p in lm.parameters() if p.requires_grad], lr=LR, betas=BETAS,
                          weight_decay=WD, sharded=True)
        out["adamw"] = adamw_implementation(opt)
        out["norms"] = _train(lm, opt, ids, mask, weights)
        state = dict(sharding.iter_full_state(lm.state_dict(), keep=rank == 0))
        out["state"] = state if rank == 0 else None

        # what full_tensor and global_grad_norm do with shards off their mesh's device (GPU
        # only): the rewrap, on an uneven shard (5 rows on 2 ranks); the norm of the shards
        uneven = distribute_tensor(torch.arange(15.0).reshape(5, 3), mesh, [Shard(0)])
        out["rewrap_uneven"] = torch.equal(
            sharding._rewrap(uneven, uneven.to_local().clone()).full_tensor(), torch.arange(15.0).reshape(5, 3))
        logp = token_logprobs(lm, ids, mask)
        (logp.float() * weights[:, :logp.shape[1]]).mean().backward()
        grads = [p.grad for p in lm.parameters() if p.grad is not None]
        out["norm_of_shards"] = (float(sharding._norm_of_shards(grads)),
                                 float(torch.nn.utils.get_total_norm(grads).full_tensor()))
        whole = [torch.ones(3)]  # a plain (replicated) tensor counts once, not once per rank
        out["norm_with_plain"] = (float(sharding._norm_of_shards(grads + whole)),
                                  (out["norm_of_shards"][1] ** 2 + 3) ** 0.5)

        # the reference model: bf16-held vs float32-held, both under FSDP's bf16 policy
        base = AutoModelForCausalLM.from_pretrained(model_path)
        ref16, ref32 = reference_model(base, "bf16"), reference_model(base, None)
        bf16_learner = _layout("bf16")
        for ref in (ref16, ref32):
            bf16_learner.shard_from_rank0(ref)
        out["ref_dtypes"] = sorted({str(p.to_local().dtype) for p in ref16.parameters()})
        with torch.no_grad():
            a = token_logprobs(ref16, ids, mask).float()
            b = token_logprobs(ref32, ids, mask).float()
        out["ref_max_diff"] = float((a - b).abs().max())

        # the layout before offload_mesh: fully_shard's default mesh, over the default group
        today = AutoModelForCausalLM.from_pretrained(model_path)
        sharding.shard_causal_lm(today, cpu_offload=True)
        try:
            token_logprobs(today, ids, mask)
            out["default_mesh"] = "ran"
        except RuntimeError as e:
            out["default_mesh"] = str(e)
    finally:
        torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tiny_path, tmp_path_factory):
    """Both ranks' findings (one spawn for every check below)."""
    import torch.multiprocessing as mp

    out_dir = str(tmp_path_factory.mktemp("offload"))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_rank, args=(_free_port(), str(tiny_path), out_dir), nprocs=WORLD, join=True)
    return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(WORLD)]


def test_offloading_ranks_shard_on_a_group_with_a_cpu_backend(two_ranks):
    for r in two_ranks:
        assert r["default_backend"] == "cuda:gloo"
        assert r["mesh_backend"] == "cpu:gloo,cuda:gloo"
        assert r["mesh_once"] and r["on_mesh"]  # the learner shards on it, made once
        # fully_shard's default mesh (the layout before offload_mesh) cannot run a CPU collective
        assert NO_CPU_BACKEND in r["default_mesh"]


def test_offloaded_shards_step_with_the_fused_kernel(two_ranks):
    assert [r["adamw"] for r in two_ranks] == ["fused"] * WORLD


def test_two_offloaded_ranks_train_like_one_learner(two_ranks, tiny_path):
    """Same batch on both ranks (FSDP averages their gradients): the same norms and weights as
    one unsharded learner with torch's default (for-loop) AdamW."""
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(tiny_path)
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    ids, mask, weights = _batch(lm.config.vocab_size)
    opt = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad], lr=LR, betas=BETAS,
                            weight_decay=WD, foreach=False)
    norms = _train(lm, opt, ids, mask, weights)
    ref = lm.state_dict()
    for r in two_ranks:
        assert r["sharded"]
        torch.testing.assert_close(torch.tensor(r["norms"]), torch.tensor(norms), rtol=1e-5, atol=0)
    state = two_ranks[0]["state"]
    assert two_ranks[1]["state"] is None and state.keys() == ref.keys()
    assert max(float((ref[k] - before[k]).abs().max()) for k in ref) > 1e-4  # the steps moved the weights
    for k in ref:
        torch.testing.assert_close(state[k], ref[k], atol=1e-5, rtol=0)


def test_the_offloaded_paths_of_full_tensor_and_grad_norm(two_ranks):
    for r in two_ranks:
        assert r["rewrap_uneven"]
        got, want = r["norm_of_shards"]
        assert got == pytest.approx(want, rel=1e-6) and want > 0
        got, want = r["norm_with_plain"]
        assert got == pytest.approx(want, rel=1e-6)


def test_sharded_bf16_reference_equals_the_float32_one(two_ranks):
    for r in two_ranks:
        assert r["ref_dtypes"] == ["torch.bfloat16"]
        assert r["ref_max_diff"] == 0.0  # FSDP's bf16 gather rounds the float32 copy to the same values


# ---------------------------------------------------------------------------- reference model
def test_reference_model_is_held_in_bf16_under_mixed_precision(tiny_path):
    from transformers import AutoModelForCausalLM

    from rllib_spear.models.logprobs import token_logprobs

    lm = AutoModelForCausalLM.from_pretrained(tiny_path)
    ref = reference_model(lm, "bf16")
    assert {p.dtype for p in ref.parameters()} == {torch.bfloat16}
    assert {b.dtype for b in ref.buffers()} == {torch.float32}  # RoPE's inv_freq keeps its precision
    assert {p.dtype for p in lm.parameters()} == {torch.float32}  # the policy is untouched
    assert not ref.training and not any(p.requires_grad for p in ref.parameters())
    if lm.config.tie_word_embeddings:
        assert ref.lm_head.weight is ref.model.embed_tokens.weight
    assert {p.dtype for p in reference_model(lm, None).parameters()} == {torch.float32}

    ids, mask, _ = _batch(lm.config.vocab_size)
    with torch.no_grad():
        fp32 = token_logprobs(lm, ids, mask).float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = token_logprobs(lm, ids, mask).float()
            held = token_logprobs(ref, ids, mask).float()
    bf16_error = float((autocast - fp32).abs().max())
    assert 0 < bf16_error < 0.05
    # the learner scores the reference under the same autocast: within bf16 rounding
    assert float((held - fp32).abs().max()) <= 3 * bf16_error
    assert float((held - autocast).abs().max()) <= 3 * bf16_error


# -------------------------------------------------------------------------------------- threads
@pytest.mark.parametrize("torch_threads, cpus, learners, expected", [
    (None, 2, 1, 2),  # a remote learner: the CPUs Ray reserves for it
    (None, 2.7, 4, 2),  # whole CPUs, as Ray's OMP_NUM_THREADS
    (None, "auto", 1, None),  # GPU learners reserve none by default: Ray's one thread stays
    (None, 0.5, 1, None),
    (None, 4, 0, None),  # the local learner lives in the driver: num_cpus_per_learner is not its
    (3, 2, 1, 3),  # torch_num_threads wins
])
def test_learner_torch_threads(torch_threads, cpus, learners, expected):
    assert learner_torch_threads(torch_threads, cpus, learners) == expected


def test_learner_threads_honour_num_cpus_per_learner():
    """What the learner's module setup runs: one thread (Ray's OMP_NUM_THREADS=1, or a cluster's)
    becomes the learner's reserved CPUs."""
    before = torch.get_num_threads()
    layout = ModuleLayout(types.SimpleNamespace(torch_num_threads=None, num_cpus_per_learner=2, num_learners=2),
                          None)
    try:
        torch.set_num_threads(1)
        assert layout.apply_threads() == 2
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_validate_warns_when_gpu_learners_offload_on_one_thread(caplog, monkeypatch):
    from rllib_spear.algorithms.grpo import layout_checks

    monkeypatch.setattr(layout_checks, "log_once", lambda key: True)
    cfg = types.SimpleNamespace(sharding="fsdp", mixed_precision="bf16", num_learners=2, grad_clip=None,
                                grad_clip_by="global_norm", cpu_offload=True, gpu_memory_gb=None,
                                engine_gpu_memory_gb=None, model_config={}, num_gpus_per_learner=1,
                                num_cpus_per_learner="auto")

    def err(msg):
        raise ValueError(msg)

    with caplog.at_level(logging.WARNING):
        layout_checks.check_learner_layout(cfg, err)
    assert "num_cpus_per_learner" in caplog.text
    caplog.clear()
    cfg.num_cpus_per_learner = 8
    with caplog.at_level(logging.WARNING):
        layout_checks.check_learner_layout(cfg, err)
    assert "num_cpus_per_learner" not in caplog.text
