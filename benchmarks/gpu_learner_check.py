"""GPU check for a bare GPU machine: torch, transformers and peft only -- no Ray, no vLLM, no network.

The first thing to run on a new GPU box, and the only GPU check where Ray and vLLM are not
installed (benchmarks/gpu_check.py needs both). ``ray`` and ``vllm`` are made unimportable
before ``rllib_spear`` is imported (``None`` in ``sys.modules``: ``import ray`` raises
``ModuleNotFoundError`` and ``importlib.util.find_spec("ray")`` is None, as when it is not
installed), so every stage runs the
library's Ray-free modules -- the learner's update core (``learner/core.py``,
which ``GRPOTorchLearner`` itself runs), the model loader (``models/hf_policy.py``), the
micro-batching, the optimizer builder, FSDP2 sharding, the planner, the weight-sync sender and
the HF engine -- whatever else is installed. One command, one JSON line per stage on stdout:

1. ``imports``: the Ray-free modules import with Ray and vLLM blocked; registration is skipped.
2. ``logprobs``: chunked (``models.logprobs.token_logprobs``, only the loss positions through
   the head, as the learner scores) vs naive (full [B, T, V] logits) log-probs and gradients of a
   bf16 model with Qwen2.5's vocabulary (151,936): the largest differences, the relative
   gradient error, and the peak memory of each.
3. ``fsdp_1p5b``: a random-init Qwen2.5-1.5B-shaped model (the bundled config.json, no download)
   FSDP2-sharded over a one-rank process group (NCCL; gloo on CPU), bf16 mixed precision with
   float32 master weights, activation checkpointing, trained through ``learner.core.LocalUpdate``
   (micro-batched forward, masked token log-probs, the Clip-Cov policy loss, backward, global
   grad norm and clipping, AdamW step): tokens/s, MFU and the peak memory against the planner's
   figure for the same layout (``planning.learner.plan_learner``).
4. ``fsdp_offload``: ``fsdp_1p5b`` with ``cpu_offload=True`` (shards, gradients and AdamW state
   in host memory, the optimizer step on the CPU, the learner's offload mesh): the same figures,
   and the first update's loss and grad norm against ``fsdp_1p5b``'s (same seed and batch).
5. ``fsdp_7b_cut``: the same for a Qwen2.5-7B-shaped model cut to the most layers whose plan fits
   ``--fit-fraction`` of the GPU's memory (the planner chooses; the whole 7B does not fit one
   H200 with float32 master weights and AdamW).
6. ``weight_sync``: the sender side of the weight sync on the sharded 1.5B model: every tensor
   all-gathered one at a time (``models.sharding.iter_full_state``), cut into buckets
   (``weight_streaming.iter_buckets``) and copied to the host through the senders' reused
   pinned staging buffer (``weight_streaming.staging.HostStaging``), in float32 and in the
   engines' dtype (bf16): bytes and GB/s of each (the bf16 payload must be half); the same
   bf16 buckets through the per-tensor host copy of before (``bf16_to_host_before``) and the
   ratio (``staging_speedup``, at least ``STAGING_TARGET`` = 5 on a GPU); and, when
   ``iter_full_state`` can keep the tensors on the GPU (``device=None``), the gather-and-cast
   alone and where the host copy's time goes (``host_copy_paths``).
7. ``hf_engine``: the HF engine (``env_runners/engines/hf_engine.py``) sampling from the bf16
   1.5B-shaped model on the GPU: tokens/s, and the gap between the sampled tokens' log-probs and
   the same tokens re-scored by ``token_logprobs``.

Then a summary line (``"stage": "summary"``, ``ok`` when every stage is). A stage that fails
prints its error and the next one runs. MFU counts model FLOPs (6 per parameter per token for
the blocks, the head on the scored tokens only, causal attention 6 T^2 H d per row and layer),
not the recomputation of activation checkpointing; ``--peak-tflops`` is the GPU's dense bf16
peak (H200 / H100 SXM: 989). ``--packed`` trains the training stages (``fsdp_1p5b``,
``fsdp_offload``, ``fsdp_7b_cut``) on packed micro-batches (docs/design.md "Packed
micro-batches"); ``--ragged r`` gives their rows different lengths (else no row is padded) and
``--attn-implementation flex_attention`` the block-sparse kernel: run a stage with and without
``--packed`` to compare tokens/s and MFU (both count real tokens only).

    python benchmarks/gpu_learner_check.py                    # GPU: every stage, about 2-3 minutes on an H200
    python benchmarks/gpu_learner_check.py --stages logprobs,fsdp_1p5b --out gpu.jsonl
    python benchmarks/gpu_learner_check.py --cpu-smoke        # CPU: every stage, tiny shapes

``--cpu-smoke`` runs the same code on CPU with tiny shapes (gloo instead of NCCL; the memory
figures are then None): tests/benchmarks/test_gpu_learner_check.py runs it. The figures of a GPU
run go in docs/design.md "Learner sharding" once measured.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

BLOCKED = ("ray", "vllm")
STAGES = ("imports", "logprobs", "fsdp_1p5b", "fsdp_offload", "fsdp_7b_cut", "weight_sync", "hf_engine")
#: The modules the stages use; none may import Ray or vLLM.
RAY_FREE_MODULES = (
    "rllib_spear", "rllib_spear.registration",
    "rllib_spear.learner", "rllib_spear.learner.core", "rllib_spear.learner.microbatching",
    "rllib_spear.learner.optim", "rllib_spear.learner.module_layout", "rllib_spear.models.hf_policy", "rllib_spear.models.logprobs",
    "rllib_spear.models.sharding", "rllib_spear.models.shapes", "rllib_spear.models.tokenizer",
    "rllib_spear.planning", "rllib_spear.planning.learner", "rllib_spear.core.losses",
    "rllib_spear.recipe.batching", "rllib_spear.weight_streaming.buckets",
    "rllib_spear.weight_streaming.staging",
    "rllib_spear.env_runners.engines.hf_engine",
)
GIB = 2**30


class BlockImports:
    """The packages :func:`block_imports` made unimportable."""

    def __init__(self, names: tuple[str, ...] = BLOCKED) -> None:
        self.names = tuple(names)


def block_imports(names: tuple[str, ...] = BLOCKED) -> BlockImports:
    """Make ``names`` unimportable as if they were not installed: ``None`` in ``sys.modules``
    (Python's own switch: ``import ray`` and ``import ray.tune`` raise ``ModuleNotFoundError``
    with ``name="ray"``, and ``importlib.util.find_spec("ray")`` returns None, which is what
    optional-dependency probes of torch and transformers ask). Call it before anything imports
    ``rllib_spear``; a blocked package already imported is an error (too late to block)."""
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in names and sys.modules[m] is not None)
    if loaded:
        raise RuntimeError(f"cannot block {names}: already imported {loaded[:3]}")
    for name in names:
        sys.modules[name] = None  # type: ignore[assignment]
    return BlockImports(names)


# ---------------------------------------------------------------------------------------- helpers
def _clean(x: Any) -> Any:
    """JSON-safe: non-finite floats as strings, numpy / torch scalars as Python numbers."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "item") and callable(x.item) and getattr(x, "ndim", 0) == 0:
        x = x.item()
    if isinstance(x, float):
        return x if math.isfinite(x) else str(x)
    return x


class Report:
    """Prints each result as one JSON line (and appends it to ``--out``)."""

    def __init__(self, out: str | None) -> None:
        self.out = out
        if out:
            open(out, "w").close()

    def emit(self, line: dict) -> None:
        text = json.dumps(_clean(line))
        print(text, flush=True)
        if self.out:
            with open(self.out, "a") as f:
                f.write(text + "\n")


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _reset_peak(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)


def _peak(dev) -> dict[str, float | None]:
    """Peak allocated / reserved GiB since the last reset (None on CPU: not measured)."""
    import torch

    if dev.type != "cuda":
        return {"peak_allocated_gib": None, "peak_reserved_gib": None}
    torch.cuda.synchronize(dev)
    return {"peak_allocated_gib": torch.cuda.max_memory_allocated(dev) / GIB,
            "peak_reserved_gib": torch.cuda.max_memory_reserved(dev) / GIB}


def _free(dev) -> None:
    import torch

    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def _model_config(name: str, a: argparse.Namespace, layers: int | None = None) -> dict:
    """The bundled config.json of ``name`` (rllib_spear/assets/model_configs), cut to ``layers``;
    under ``--cpu-smoke`` the same architecture (tied or not, bias, GQA) with tiny widths."""
    from rllib_spear.models.shapes import bundled_model_config

    cfg = dict(bundled_model_config(name))
    if a.cpu_smoke:
        cfg.update(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                   num_hidden_layers=4, vocab_size=4096, max_window_layers=4, max_position_embeddings=4096,
                   bos_token_id=1, eos_token_id=2)  # ids inside the small vocabulary
    if layers is not None:
        cfg["num_hidden_layers"] = int(layers)
        cfg["max_window_layers"] = min(int(cfg.get("max_window_layers", layers)), int(layers))
    return cfg


def _hf_config(cfg: dict, attn_implementation: str | None = None):
    from transformers import AutoConfig

    cfg = {k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version", "torch_dtype")}
    if attn_implementation is not None:  # None: transformers' default ("sdpa")
        cfg["attn_implementation"] = attn_implementation
    return AutoConfig.for_model(cfg.pop("model_type"), **cfg)


def _layout(cpu_offload: bool = False, packed: bool = False, attention: str | None = None):
    """The learner layout the training stages run: one FSDP2 rank, bf16 compute over float32
    master weights, activation checkpointing (and with ``cpu_offload`` the shards, gradients and
    AdamW state in host memory; ``packed``/``attention``: ``--packed``, ``--attn-implementation``)."""
    from rllib_spear.planning.layouts import LearnerLayout

    return LearnerLayout(sharding="fsdp", num_learners=1, mixed_precision="bf16", activation_checkpointing=True,
                         weight_dtype="float32", cpu_offload=cpu_offload, packed=packed, attention=attention)


def _plan(shape, a, cpu_offload: bool = False):
    from rllib_spear.planning.learner import plan_learner

    layout = _layout(cpu_offload, packed=bool(getattr(a, "packed", False)),
                     attention=getattr(a, "attn_implementation", None))
    return plan_learner(shape, layout, micro_batch_token_budget=a.budget, max_model_len=a.seq)


def _init_process_group(a, dev) -> None:
    """A one-rank process group on a file store (NCCL on the GPU, gloo on CPU)."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    store = os.path.join(tempfile.mkdtemp(prefix="gpu_learner_check_"), "store")
    backend = a.backend or ("nccl" if dev.type == "cuda" else "gloo")
    dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1)


def _sharded_model(a, dev, cfg: dict, cpu_offload: bool = False):
    """The learner's FSDP path on rank 0: build (random init, the library's loader), shard
    (``shard_causal_lm``), fill the shards from the full state (``load_full_state_from_rank0``).
    ``cpu_offload``: as the learner does it (``learner.module_layout``): the full model in host memory,
    sharded on ``offload_mesh`` (a group with a CPU backend beside NCCL) with FSDP2's CPU
    offload. The random init runs on ``dev`` either way (the same seed then gives the same
    weights: CPU and CUDA draw different streams), and the offloaded model moves to host first."""
    from rllib_spear.models.hf_policy import load_causal_lm
    from rllib_spear.models.sharding import load_full_state_from_rank0, offload_mesh, shard_causal_lm

    _init_process_group(a, dev)
    model = load_causal_lm(config=_hf_config(cfg, a.attn_implementation), dtype="float32",
                           gradient_checkpointing=True, device=dev)
    if cpu_offload:
        model.to("cpu")
        _free(dev)  # the GPU copy's blocks: not the offloaded layout's memory
    full = dict(model.state_dict())
    mesh = offload_mesh(dev.type, cpu_offload=True) if cpu_offload else None
    shard_causal_lm(model, mixed_precision="bf16", cpu_offload=cpu_offload, mesh=mesh)
    load_full_state_from_rank0(model, full, dev)
    del full
    return model


def _batch(a, vocab: int, *, rows: int, seq: int, seed: int = 0) -> dict:
    """A learner batch (``recipe.batching.build_learner_batches``) of ``rows`` trajectories of
    ``seq`` tokens (``--ragged`` r > 0: of lengths drawn uniformly in [(1 - r) seq, seq], so the
    padded micro-batches carry padding): a prompt of a quarter of the row, then the assistant
    tokens (the loss tokens) with behaviour log-probs -log(V) (what a random-init model gives),
    in groups of 4 with advantages +-1."""
    import numpy as np

    from rllib_spear.core.trajectory import Segment, Trajectory
    from rllib_spear.recipe.batching import LearnerRow, build_learner_batches

    rng = np.random.default_rng(seed)
    lp = -math.log(vocab)
    out = []
    for i in range(rows):
        n = seq if not a.ragged else int(rng.integers(max(2, int(seq * (1 - a.ragged))), seq + 1))
        prompt = max(1, n // 4)
        segs = [Segment("prompt", rng.integers(3, vocab, prompt).tolist()),
                Segment("assistant", rng.integers(3, vocab, n - prompt).tolist(), [lp] * (n - prompt), 0)]
        t = Trajectory(uid=f"g{i // 4}", segments=segs, outcome_reward=float(i % 2), step_rewards=[0.0],
                       traj_id=f"t{i}")
        out.append(LearnerRow(t, t.token_advantages(1.0 if i % 2 else -1.0), t.loss_mask()))
    return build_learner_batches(out, num_learners=0, minibatch_size=None, t_norm=float(seq), pad_token_id=0,
                                 seed=seed)[0]


def _padded_tokens(batch: dict, budget: int) -> int:
    """Tokens the padded micro-batches of ``batch`` carry (rows x longest row, summed); a packed
    run computes ``tokens_per_update`` of them."""
    import torch

    from rllib_spear.learner.microbatching import token_budget_microbatches

    mask = torch.as_tensor(batch["attention_mask"])
    lengths = mask.sum(1)
    return int(sum(len(p) * int(lengths[p].max()) for p in token_budget_microbatches(mask, budget)))


def _train_flops(shape, batch: dict) -> float:
    """Model FLOPs of one update on ``batch`` (forward + backward, no recomputation): 6 per
    matmul weight per token in the blocks, 6 V h per scored (loss) token in the head, and causal
    attention 6 T^2 H d per row and layer (2 T^2 H d forward: QK^T and AV, half of it masked).

    Real tokens only, packed or padded (``--packed``): T is a row's real length, and neither the
    padding a padded micro-batch computes nor the masked-off blocks of a packed row's N x N
    scores (sdpa computes them; flex_attention skips them) count, so the MFU of the two runs
    compares the same useful work."""
    import numpy as np

    lengths = np.asarray(batch["attention_mask"]).sum(1)
    tokens = float(lengths.sum())
    scored = float((np.asarray(batch["loss_mask"]) > 0).sum())
    blocks = 6.0 * shape.layers * shape.block_linear_weights * tokens
    head = 6.0 * shape.vocab * shape.hidden * scored
    attention = 6.0 * shape.layers * shape.q_width * float((lengths.astype(np.float64) ** 2).sum())
    return blocks + head + attention


# ---------------------------------------------------------------------------------------- stages
def stage_imports(a, dev, blocked: BlockImports) -> dict:
    import importlib
    import importlib.util

    failed = {}
    for name in RAY_FREE_MODULES:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - reported, not raised: every module is tried
            failed[name] = f"{type(e).__name__}: {e}"
    from rllib_spear.registration import register_all

    registered = register_all()
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in blocked.names and sys.modules[m] is not None)
    importable = {}
    for name in blocked.names:  # the block holds: neither importable nor found
        try:
            importlib.import_module(name)
            importable[name] = True
        except ModuleNotFoundError:
            importable[name] = importlib.util.find_spec(name) is not None
    return {"ok": not failed and not leaked and not registered and not any(importable.values()),
            "modules": len(RAY_FREE_MODULES), "failed": failed, "registered_with_tune": registered,
            "blocked": list(blocked.names), "importable": importable, "leaked": leaked}


def stage_logprobs(a, dev, blocked: BlockImports) -> dict:
    import torch

    from rllib_spear.models.hf_policy import load_causal_lm
    from rllib_spear.models.logprobs import naive_token_logprobs, token_logprobs

    vocab = 151936
    hidden, layers, rows, seq = (32, 1, 2, 32) if a.cpu_smoke else (1536, 2, a.lp_rows, a.seq)
    cfg = _model_config("Qwen2.5-1.5B-Instruct", a, layers=layers)
    cfg.update(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden,
               num_attention_heads=max(1, hidden // 128) if not a.cpu_smoke else 2,
               num_key_value_heads=max(1, hidden // 768) if not a.cpu_smoke else 1)
    torch.manual_seed(0)
    model = load_causal_lm(config=_hf_config(cfg), dtype="bfloat16", device=dev)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (rows, seq), generator=g).to(dev)
    mask = torch.ones_like(ids)
    loss_mask = torch.zeros(rows, seq, device=dev)
    loss_mask[:, seq // 4:] = 1.0  # the assistant tokens: what the learner puts through the head
    n = float(loss_mask.sum())
    params = [p for p in model.parameters()]

    def run(fn) -> tuple[torch.Tensor, list[torch.Tensor], dict, float]:
        model.zero_grad(set_to_none=True)
        _free(dev)
        _reset_peak(dev)
        base = torch.cuda.memory_allocated(dev) / GIB if dev.type == "cuda" else None
        t0 = time.perf_counter()
        logp = fn()
        (-(logp.float() * loss_mask).sum() / n).backward()
        _sync(dev)
        secs = time.perf_counter() - t0
        peak = _peak(dev)
        if base is not None:
            peak["peak_above_model_gib"] = peak["peak_allocated_gib"] - base
        grads = [p.grad.detach().float().clone() for p in params]
        return logp.detach().float(), grads, peak, secs

    lp_naive, g_naive, peak_naive, t_naive = run(lambda: naive_token_logprobs(model, ids, mask))
    lp_chunk, g_chunk, peak_chunk, t_chunk = run(
        lambda: token_logprobs(model, ids, mask, score_mask=loss_mask > 0))
    m = loss_mask > 0
    diff = (lp_chunk - lp_naive).abs()[m]
    num = math.sqrt(sum(float(((x - y) ** 2).sum()) for x, y in zip(g_chunk, g_naive)))
    den = math.sqrt(sum(float((y ** 2).sum()) for y in g_naive))
    grad_rel = num / max(den, 1e-30)
    agree = float(diff.max()) <= a.logp_tol and grad_rel <= a.grad_tol
    out = {"ok": agree, "vocab": vocab, "dtype": "bfloat16", "rows": rows, "seq": seq,
           "scored_tokens": int(n), "logp_max_abs_diff": float(diff.max()), "logp_mean_abs_diff": float(diff.mean()),
           "grad_rel_err": grad_rel, "tolerances": {"logp": a.logp_tol, "grad_rel": a.grad_tol},
           "naive": {**peak_naive, "seconds": t_naive}, "chunked": {**peak_chunk, "seconds": t_chunk}}
    if peak_naive.get("peak_above_model_gib"):
        out["chunked_over_naive_peak"] = peak_chunk["peak_above_model_gib"] / peak_naive["peak_above_model_gib"]
    if not agree:
        out["error"] = "chunked and naive log-probs / gradients differ beyond the tolerances"
    return out


def _train(a, dev, cfg: dict, name: str, cpu_offload: bool = False) -> dict:
    """Build the sharded model, train ``1 + --steps`` updates through ``learner.core.LocalUpdate``
    on a synthetic batch, and measure them (the first is the warm-up)."""
    import torch

    from rllib_spear.learner.core import LocalUpdate, UpdateSettings
    from rllib_spear.learner.optim import adamw_implementation, build_adamw
    from rllib_spear.core.losses import PolicyLossConfig
    from rllib_spear.models.shapes import ModelShape

    shape = ModelShape.from_config(cfg, name)
    plan = _plan(shape, a, cpu_offload)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    model = _sharded_model(a, dev, cfg, cpu_offload)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_adamw(params, lr=1e-6, betas=(0.9, 0.999), weight_decay=0.01, sharded=True)
    # SPEAR's on-policy loss: Clip-Cov with clip-higher, token sums over a fixed length
    loss = PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, loss_mode="clip_cov",
                            loss_agg_mode="seq-mean-token-sum-norm").validate()
    update = LocalUpdate(model, optimizer, loss_config=loss, device=dev, grad_clip=1.0,
                         settings=UpdateSettings(micro_batch_token_budget=a.budget, entropy_metric_tokens=1024,
                                                 packed_microbatches=a.packed))
    batch = _batch(a, shape.vocab, rows=a.rows, seq=a.seq)
    build_s = time.perf_counter() - t0
    _reset_peak(dev)
    first = update.update(batch)  # warm-up: kernels, allocator, optimizer state
    _sync(dev)
    times, results = [], []
    for _ in range(a.steps):
        t = time.perf_counter()
        results.append(update.update(batch))
        _sync(dev)
        times.append(time.perf_counter() - t)
    peak = _peak(dev)
    # the fastest timed update: the first ones can still pay one-off costs (compilation of
    # FSDP's hooks on CPU, allocator growth)
    secs = min(times)
    tokens = results[-1]["trained_tokens"]
    flops = _train_flops(shape, batch)
    planned = plan.total / GIB
    out = {"ok": all(math.isfinite(r["grad_norm"]) and math.isfinite(r["total_loss"]) for r in [first] + results),
           "model": shape.summary(), "params": shape.num_params, "layers": shape.layers,
           "layout": _layout(cpu_offload, packed=a.packed, attention=a.attn_implementation).label() + " + bf16",
           "optimizer": f"AdamW ({adamw_implementation(optimizer)})",
           "rows": a.rows, "seq": a.seq, "micro_batch_token_budget": a.budget,
           "packed": a.packed, "attn_implementation": model.config._attn_implementation, "ragged": a.ragged,
           "padded_tokens_per_update": _padded_tokens(batch, a.budget), "tokens_per_update": tokens, "seconds_per_update": secs, "update_seconds": times,
           "tokens_per_s": tokens / secs,
           "tflops_per_s": flops / secs / 1e12, "build_s": build_s,
           "mfu": (flops / secs / 1e12) / a.peak_tflops if dev.type == "cuda" else None,
           "peak_tflops": a.peak_tflops, **peak, "planned_gib": planned,
           "planned_without_allowance_gib": planned - plan.overhead / GIB,
           "loss": [r["total_loss"] for r in [first] + results],
           "grad_norm": [r["grad_norm"] for r in [first] + results]}
    if peak["peak_reserved_gib"] is not None:
        out["reserved_over_planned"] = peak["peak_reserved_gib"] / planned
    try:  # the offloaded state lives here
        import psutil

        out["host_rss_gib"] = psutil.Process().memory_info().rss / GIB
    except ImportError:
        out["host_rss_gib"] = None
    del update, optimizer, params, model
    return out


#: the first losses and grad norms of ``fsdp_1p5b``, which ``fsdp_offload`` must reproduce
_ON_DEVICE_RUN: dict = {}


def stage_fsdp_1p5b(a, dev, blocked: BlockImports) -> dict:
    out = _train(a, dev, _model_config("Qwen2.5-1.5B-Instruct", a), "Qwen2.5-1.5B-Instruct (random init)")
    _ON_DEVICE_RUN.update(loss=out["loss"], grad_norm=out["grad_norm"])
    return out


def stage_fsdp_offload(a, dev, blocked: BlockImports) -> dict:
    """``fsdp_1p5b`` with ``cpu_offload=True``: the shards, gradients and AdamW state in host
    memory, the AdamW step on the CPU, the offload mesh's group ("cpu:gloo,cuda:nccl" on a GPU),
    and the grad norm and clipping over offloaded shards (``global_grad_norm``'s staging path,
    which a CPU mesh never takes). Same seed and batch as ``fsdp_1p5b``: the first update's loss
    and grad norm (before any optimizer step) must equal that run's to ``--offload-tol``
    (relative), and the later ones stay close (the AdamW step runs on other hardware)."""
    out = _train(a, dev, _model_config("Qwen2.5-1.5B-Instruct", a), "Qwen2.5-1.5B-Instruct (random init)",
                 cpu_offload=True)
    if not _ON_DEVICE_RUN:
        out["vs_on_device"] = None  # fsdp_1p5b did not run first
        return out

    def rel(x: list, y: list) -> list:
        return [abs(p - q) / max(abs(q), 1e-12) for p, q in zip(x, y)]

    loss_rel, norm_rel = rel(out["loss"], _ON_DEVICE_RUN["loss"]), rel(out["grad_norm"], _ON_DEVICE_RUN["grad_norm"])
    out["vs_on_device"] = {"loss_rel_diff": loss_rel, "grad_norm_rel_diff": norm_rel}
    if not (loss_rel and loss_rel[0] <= a.offload_tol and norm_rel[0] <= a.offload_tol):
        out["ok"] = False
        out["error"] = (f"the offloaded first update differs from the on-device one: loss {loss_rel[:1]}, "
                        f"grad norm {norm_rel[:1]} (relative; tolerance {a.offload_tol})")
    return out


def choose_layers(shape_of: Callable[[int], Any], max_layers: int, budget_gib: float,
                  plan_gib: Callable[[Any], float]) -> int:
    """The most layers (1..``max_layers``) whose planned peak fits ``budget_gib`` (0: none)."""
    best = 0
    for n in range(1, max_layers + 1):
        if plan_gib(shape_of(n)) <= budget_gib:
            best = n
    return best


def stage_fsdp_7b_cut(a, dev, blocked: BlockImports) -> dict:
    import torch

    from rllib_spear.models.shapes import ModelShape

    name = "Qwen2.5-7B-Instruct"
    full = _model_config(name, a)
    max_layers = int(full["num_hidden_layers"])

    def shape_of(n: int):
        return ModelShape.from_config(_model_config(name, a, layers=n), name)

    def plan_gib(shape) -> float:
        return _plan(shape, a).total / GIB

    if dev.type == "cuda":
        gpu_gib = torch.cuda.get_device_properties(dev).total_memory / GIB
    else:  # no GPU memory to fit: a budget that holds half the layers exercises the choice
        gpu_gib = plan_gib(shape_of(max(1, max_layers // 2))) / a.fit_fraction
    budget = gpu_gib * a.fit_fraction
    layers = choose_layers(shape_of, max_layers, budget, plan_gib)
    info = {"gpu_gib": gpu_gib, "fit_fraction": a.fit_fraction, "budget_gib": budget,
            "planned_full_model_gib": plan_gib(shape_of(max_layers)), "full_layers": max_layers,
            "chosen_layers": layers}
    if layers == 0:
        return {"ok": False, "error": "not even one layer fits the budget", **info}
    out = _train(a, dev, _model_config(name, a, layers=layers), f"{name} cut to {layers} layers (random init)")
    return {**out, **info}


#: The host path's speed-up the staging buffer must reach on a GPU (the issue: >= 5x the
#: per-tensor host copy, on this stage's bf16 weights, gather included).
STAGING_TARGET = 5.0


def _per_tensor_host_copy(bucket) -> dict:
    """The host path before the staging buffer, kept here as the baseline: each tensor copied to
    the host on its own (``.to("cpu")``: pageable memory) and then into a fresh buffer per dtype
    (what ``pack_bucket`` did for the collective; the object store made the same per-tensor
    copies)."""
    import torch

    meta = bucket.meta
    buffers = {dt: torch.empty(n, dtype=torch.uint8) for dt, n in meta.buffer_bytes.items()}
    for (_, t), spec in zip(bucket.items, meta.tensors):
        if spec.nbytes:
            host = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
            buffers[spec.dtype][spec.offset:spec.offset + spec.nbytes].copy_(host)
    return buffers


def stage_weight_sync(a, dev, blocked: BlockImports) -> dict:
    import inspect

    import torch

    from rllib_spear.models.sharding import iter_full_state
    from rllib_spear.weight_streaming.buckets import iter_buckets
    from rllib_spear.weight_streaming.staging import HostStaging

    cfg = _model_config("Qwen2.5-1.5B-Instruct", a)
    torch.manual_seed(0)
    model = _sharded_model(a, dev, cfg)
    tied = bool(cfg.get("tie_word_embeddings", False))
    # the engines' weights: a tied lm_head.weight is the embedding, sent once
    state = {k: v for k, v in model.state_dict().items() if not (tied and k.endswith("lm_head.weight"))}
    accepts = inspect.signature(iter_full_state).parameters
    library_cast = "dtype" in accepts
    bucket_bytes = int(a.bucket_mb * 2**20)
    # where iter_full_state can keep the gathered tensors on the device, they reach the host
    # through the path under test (the library's senders gather on the device)
    gather_kw = {"device": None} if "device" in accepts else {}

    def source(dtype):
        if library_cast:
            return iter_full_state(state, keep=True, dtype=dtype, **gather_kw)
        # iter_full_state without a cast (an older library): cast here, one tensor at a time
        return ((k, t if dtype is None else t.to(dtype)) for k, t in iter_full_state(state, keep=True, **gather_kw))

    def measure(dtype, to_host) -> dict:
        """Gather, cast and copy every bucket to the host with ``to_host``."""
        _sync(dev)
        t0 = time.perf_counter()
        nbytes = buckets = 0
        for bucket in iter_buckets(source(dtype), bucket_bytes, pack=False):
            to_host(bucket)
            nbytes += bucket.meta.nbytes
            buckets += 1
            del bucket
        _sync(dev)
        secs = time.perf_counter() - t0
        return {"bytes": nbytes, "buckets": buckets, "seconds": secs, "gb_per_s": nbytes / secs / 1e9}

    staging = HostStaging()  # one per sender, reused by every bucket and sync, as the senders hold it
    measure(torch.bfloat16, _per_tensor_host_copy)  # warm-ups: the allocator, CUDA's own pinned staging,
    measure(None, staging.pack)  # and the staging buffer sized (and pinned) for the largest bucket
    before = measure(torch.bfloat16, _per_tensor_host_copy)
    fp32 = measure(None, staging.pack)
    bf16 = measure(torch.bfloat16, staging.pack)
    speedup = bf16["gb_per_s"] / before["gb_per_s"]
    half = bf16["bytes"] * 2 == fp32["bytes"]
    fast = speedup >= STAGING_TARGET or dev.type != "cuda"  # the target is a GPU's (pinned DMA)
    out = {"ok": half and fast, "tensors": len(state), "bucket_mb": a.bucket_mb,
           "engine_dtype": "bfloat16", "cast": "iter_full_state(dtype=...)" if library_cast else "in this check",
           "fp32_to_host": fp32, "bf16_to_host": bf16, "bytes_ratio": bf16["bytes"] / fp32["bytes"],
           "bf16_to_host_before": before, "staging_speedup": speedup, "staging_target": STAGING_TARGET,
           "staging_buffer": {"bytes": staging.capacity, "pinned": staging.pinned}}
    staging.release()
    if "device" in accepts:
        # the gather and cast alone, kept on the device (what an NCCL / IPC transport sends)
        _sync(dev)
        t0 = time.perf_counter()
        nbytes = 0
        for _, t in iter_full_state(state, keep=True, dtype=torch.bfloat16, device=None):
            nbytes += t.numel() * t.element_size()
            del t
        _sync(dev)
        secs = time.perf_counter() - t0
        out["bf16_on_device"] = {"bytes": nbytes, "seconds": secs, "gb_per_s": nbytes / secs / 1e9}
        out["host_copy_paths"] = _host_copy_paths(state, dev, bucket_bytes)
    if not half:
        out["error"] = f"the bf16 payload is {out['bytes_ratio']:.3f} of the fp32 one, not half"
    elif not fast:
        out["error"] = (f"the staged host path is {speedup:.1f}x the per-tensor copy "
                        f"({bf16['gb_per_s']:.2f} vs {before['gb_per_s']:.2f} GB/s), under {STAGING_TARGET:g}x")
    del state, model
    return out


def _host_copy_paths(state: dict, dev, bucket_bytes: int) -> dict:
    """Where the host path's time goes, on the bf16 weights already gathered on the device
    (the gather is timed above): (a) ``per_tensor_pageable``, one tensor at a time into pageable
    memory (what ``iter_full_state(device="cpu")`` does); (b) ``bucket_pageable``, each bucket
    packed on the device into one flat buffer, then one copy into pageable memory; (c)
    ``bucket_pinned``, the same into one pinned staging buffer reused by every bucket; (d)
    ``bucket_pinned_then_host``, (c) plus a host copy out of the staging buffer (what
    ``ray.put`` adds). (c) and (d) need CUDA (pinned memory); on CPU they are None. (e)
    ``host_staging``: the library's ``HostStaging`` (what the object-store and collective
    senders run), which should match (c)."""
    import torch

    from rllib_spear.models.sharding import iter_full_state
    from rllib_spear.weight_streaming.buckets import iter_buckets
    from rllib_spear.weight_streaming.staging import HostStaging

    named = list(iter_full_state(state, keep=True, dtype=torch.bfloat16, device=None))
    tensors = [t for _, t in named]
    # the library's bucket cut (unpacked: the tensors as they are, on the device)
    unpacked = list(iter_buckets(iter(named), bucket_bytes, pack=False))
    buckets = [[t for _, t in b.items] for b in unpacked]
    total = sum(t.numel() * t.element_size() for t in tensors)
    biggest = max(sum(t.numel() * t.element_size() for t in b) for b in buckets)

    def packed(bucket) -> "torch.Tensor":
        n = sum(t.numel() * t.element_size() for t in bucket)
        flat = torch.empty(n, dtype=torch.uint8, device=tensors[0].device)
        off = 0
        for t in bucket:
            k = t.numel() * t.element_size()
            flat[off:off + k].copy_(t.reshape(-1).view(torch.uint8))
            off += k
        return flat

    def timed(fn) -> dict:
        _sync(dev)
        t0 = time.perf_counter()
        fn()
        _sync(dev)
        secs = time.perf_counter() - t0
        return {"seconds": secs, "gb_per_s": total / secs / 1e9}

    def per_tensor():
        for t in tensors:
            t.to("cpu")

    def bucket_pageable():
        for b in buckets:
            packed(b).to("cpu")

    out: dict = {"bytes": total, "buckets": len(buckets)}
    per_tensor()  # warm-up
    out["per_tensor_pageable"] = timed(per_tensor)
    out["bucket_pageable"] = timed(bucket_pageable)
    staging = HostStaging()
    staging.pack(max(unpacked, key=lambda b: b.meta.nbytes))  # warm-up: allocate (and pin) once
    out["host_staging"] = timed(lambda: [staging.pack(b) for b in unpacked])
    staging.release()
    if dev.type != "cuda":
        out["bucket_pinned"] = out["bucket_pinned_then_host"] = None
        return out
    t0 = time.perf_counter()
    staging = torch.empty(biggest, dtype=torch.uint8, pin_memory=True)
    out["pinned_alloc_seconds"] = time.perf_counter() - t0

    def bucket_pinned(then_host: bool = False):
        for b in buckets:
            flat = packed(b)
            view = staging[:flat.numel()]
            view.copy_(flat, non_blocking=True)
            torch.cuda.current_stream(dev).synchronize()
            if then_host:
                view.clone()

    out["bucket_pinned"] = timed(bucket_pinned)
    out["bucket_pinned_then_host"] = timed(lambda: bucket_pinned(True))
    del staging, tensors
    return out


def stage_hf_engine(a, dev, blocked: BlockImports) -> dict:
    import torch

    from rllib_spear.env_runners.engines.base import SamplingConfig
    from rllib_spear.env_runners.engines.hf_engine import HFEngine
    from rllib_spear.models.factory import conversation_texts, synthetic_conversations
    from rllib_spear.models.hf_policy import load_causal_lm
    from rllib_spear.models.logprobs import token_logprobs
    from rllib_spear.models.tokenizer import train_chat_tokenizer

    cfg = _model_config("Qwen2.5-1.5B-Instruct", a)
    tok = train_chat_tokenizer(conversation_texts(synthetic_conversations(200, seed=0)), vocab_size=1024)
    if len(tok) > cfg["vocab_size"]:
        raise ValueError(f"tokenizer has {len(tok)} ids > vocab {cfg['vocab_size']}")
    torch.manual_seed(0)
    model = load_causal_lm(config=_hf_config(cfg), dtype="bfloat16", device=dev).eval()
    engine = HFEngine(model=model, tokenizer=tok, device=dev)
    g = torch.Generator().manual_seed(0)
    n, plen, new = (4, 8, 8) if a.cpu_smoke else (a.gen_prompts, a.gen_prompt_len, a.gen_tokens)
    prompts = torch.randint(3, len(tok), (n, plen), generator=g).tolist()
    engine.generate(prompts[:2], SamplingConfig(temperature=1.0, max_new_tokens=4, seed=1))  # warm-up
    _sync(dev)
    t0 = time.perf_counter()
    outs = engine.generate(prompts, SamplingConfig(temperature=1.0, max_new_tokens=new, seed=0))
    _sync(dev)
    secs = time.perf_counter() - t0
    generated = sum(len(o.token_ids) for o in outs)
    # re-score prompt + completion teacher-forced, as the learner does (right padding)
    T = plen + max(len(o.token_ids) for o in outs)
    ids = torch.zeros(n, T, dtype=torch.long)
    mask = torch.zeros(n, T, dtype=torch.long)
    for i, (p, o) in enumerate(zip(prompts, outs)):
        seq = p + o.token_ids
        ids[i, :len(seq)] = torch.tensor(seq)
        mask[i, :len(seq)] = 1
    with torch.inference_mode():
        scored = token_logprobs(model, ids.to(dev), mask.to(dev)).float().cpu()
    gaps = [abs(float(scored[i, plen + j]) - lp) for i, o in enumerate(outs) for j, lp in enumerate(o.logprobs)]
    sampled_mean = sum(lp for o in outs for lp in o.logprobs) / max(generated, 1)
    out = {"ok": generated > 0 and all(math.isfinite(x) for x in gaps), "prompts": n, "prompt_len": plen,
           "max_new_tokens": new, "generated_tokens": generated, "seconds": secs, "tokens_per_s": generated / secs,
           "dtype": "bfloat16", "sampled_logp_mean": sampled_mean,
           "logp_gap_max": max(gaps) if gaps else None, "logp_gap_mean": sum(gaps) / len(gaps) if gaps else None}
    engine.shutdown()
    del model
    return out


STAGE_FUNCS = {"imports": stage_imports, "logprobs": stage_logprobs, "fsdp_1p5b": stage_fsdp_1p5b,
               "fsdp_offload": stage_fsdp_offload, "fsdp_7b_cut": stage_fsdp_7b_cut, "weight_sync": stage_weight_sync, "hf_engine": stage_hf_engine}


# ---------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-smoke", action="store_true", help="every stage on CPU with tiny shapes (gloo)")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {', '.join(STAGES)}")
    ap.add_argument("--out", default=None, help="also write the JSON lines to this file")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU (H200: 989)")
    ap.add_argument("--seq", type=int, default=None, help="tokens per row (GPU 2048, smoke 32)")
    ap.add_argument("--rows", type=int, default=None, help="rows per update (GPU 32, smoke 8)")
    ap.add_argument("--budget", type=int, default=None, help="micro_batch_token_budget (GPU 16384, smoke 64)")
    ap.add_argument("--steps", type=int, default=None, help="timed updates after the warm-up (GPU 3, smoke 1)")
    ap.add_argument("--packed", action="store_true",
                    help="training stages: packed micro-batches (UpdateSettings(packed_microbatches=True): real-token budgets)")
    ap.add_argument("--attn-implementation", default=None,
                    help="training stages: the model's attention (sdpa, flex_attention, eager; default: "
                         "transformers' sdpa). flex_attention has no CPU backward: GPU only")
    ap.add_argument("--ragged", type=float, default=0.0,
                    help="training stages: row lengths uniform in [(1 - r) seq, seq] (0: every row seq tokens)")
    ap.add_argument("--lp-rows", type=int, default=4, help="rows of the log-prob comparison (GPU)")
    ap.add_argument("--logp-tol", type=float, default=0.25, help="max |chunked - naive| log-prob in bf16")
    ap.add_argument("--grad-tol", type=float, default=0.05, help="max relative gradient error in bf16")
    ap.add_argument("--offload-tol", type=float, default=1e-3,
                    help="max relative difference of the offloaded first update's loss and grad norm")
    ap.add_argument("--fit-fraction", type=float, default=0.8,
                    help="share of the GPU's memory the 7B cut's plan may use")
    ap.add_argument("--bucket-mb", type=float, default=512.0, help="weight-sync bucket size")
    ap.add_argument("--gen-prompts", type=int, default=64)
    ap.add_argument("--gen-prompt-len", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--backend", default=None, help="process-group backend (default nccl on GPU, gloo on CPU)")
    ap.add_argument("--time-budget-s", type=float, default=480.0,
                    help="skip the stages that would start after this many seconds")
    a = ap.parse_args(argv)
    smoke = a.cpu_smoke
    for k, gpu, cpu in (("seq", 2048, 32), ("rows", 32, 8), ("budget", 16384, 64), ("steps", 3, 1)):
        if getattr(a, k) is None:
            setattr(a, k, cpu if smoke else gpu)
    a.stages = [s.strip() for s in a.stages.split(",") if s.strip()]
    unknown = [s for s in a.stages if s not in STAGE_FUNCS]
    if unknown:
        ap.error(f"unknown stages {unknown}; choose from {', '.join(STAGES)}")
    return a


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    blocked = block_imports()  # before rllib_spear: the library must work without Ray and vLLM
    a = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    report = Report(a.out)
    # an indexed device: torch.cuda.set_device and FSDP's default mesh need one
    dev = torch.device("cuda", 0) if torch.cuda.is_available() and not a.cpu_smoke else torch.device("cpu")
    env = {"stage": "environment", "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
           "torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
           "cpu_smoke": a.cpu_smoke, "stages": a.stages}
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError as e:  # the stages that need it will say so
        env["transformers"] = f"missing: {e}"
    if not a.cpu_smoke and dev.type != "cuda":
        env["warning"] = "no GPU: running the GPU shapes on CPU (use --cpu-smoke for tiny ones)"
    report.emit(env)
    results: dict[str, bool] = {}
    for name in a.stages:
        t0 = time.perf_counter()
        if t0 - start > a.time_budget_s:
            res = {"ok": False, "error": f"skipped: the time budget of {a.time_budget_s:.0f} s is spent"}
        else:
            try:
                res = STAGE_FUNCS[name](a, dev, blocked)
            except Exception as e:  # noqa: BLE001 - reported as the stage's result, the next stage runs
                res = {"ok": False, "error": f"{type(e).__name__}: {e}",
                       "traceback": traceback.format_exc(limit=8)[-3000:]}
        _free(dev)
        results[name] = bool(res.get("ok"))
        report.emit({"stage": name, **res, "stage_seconds": time.perf_counter() - t0})
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    report.emit({"stage": "summary", "ok": bool(results) and all(results.values()), "stages": results,
                 "device": env["device"], "wall_s": time.perf_counter() - start})
    return 0 if results and all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
