"""Per-rank parameter / gradient / optimizer-state bytes of the GRPO learner under DDP and FSDP2.

A ~20M-parameter random-init Qwen2 model (built once, no downloads, with the project's own ChatML
tokenizer: ``rllib_spear.models.factory.build_tiny_model``, cached under
``$RLLIB_SPEAR_CACHE/bench-qwen2-20m-<hash>``) is trained for a few iterations of the GRPO
algorithm in four learner layouts, on CPU over gloo:

* ``ddp-1``: one remote learner (``num_learners=1``; RLlib does not wrap a single learner in DDP);
* ``ddp-2``: two remote learners, RLlib's DDP (a full replica per rank);
* ``fsdp-1``: one remote learner rank with ``sharding="fsdp"`` (a world of one: nothing to split);
* ``fsdp-2``: two ranks, FSDP2 ``fully_shard`` per block and on the root.

Every run replays the same synthetic trajectories (seeded token ids and rewards, non-zero
advantages) through ``algo.train()`` (a ``TrajectoryCallback`` replaces each sampled batch), one
optimizer step per iteration.
After the last iteration each rank reports ``learner.state_bytes()`` (the bytes it stores for
parameters, gradients and AdamW state at its last optimizer step: a DTensor counts its local shard)
through ``learner_group.foreach_learner``. Learner throughput is the trained tokens over the wall
time of the learner update (the algorithm's ``learner_update_s`` metric: batch building,
``learner_group.update``, result aggregation; the region behind ``train_tokens_per_s``), over the
iterations after a warm-up.

    python benchmarks/learner_memory.py [--trajs 16 --tokens 128 --iters 3] [--layouts ddp-2,fsdp-2]
    python benchmarks/learner_memory.py --mixed-precision bf16 --layouts ddp-2,fsdp-2

The default run takes about 4.5 minutes on 2 cores. ``--mixed-precision bf16`` leaves the state
bytes as they are (fp32 master weights, gradients and AdamW state either way) and, on CPUs without
native bf16 matrix units, is about 14x slower (14 minutes for two layouts on 2 cores).
Results: docs/benchmarks/learner_memory.md. Target: FSDP-2 / DDP-2 per-rank total <= 0.55.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from rllib_spear.callbacks import TrajectoryCallback  # noqa: E402

#: ~20M parameters: 7 Qwen2 blocks of hidden 512 (8 heads of 64, 2 KV heads, MLP 1408) and the
#: project tokenizer's ~500-token vocabulary, tied embeddings.
MODEL_20M = dict(arch="qwen2", hidden=512, layers=7, heads=8, kv_heads=2, intermediate=1408,
                 vocab_size=4096, seed=0)
LAYOUTS = {"ddp-1": ("ddp", 1), "ddp-2": ("ddp", 2), "fsdp-1": ("fsdp", 1), "fsdp-2": ("fsdp", 2)}
MIB = float(1 << 20)
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def model_20m_path(cache_dir: str | None = None) -> str:
    """The cached ~20M-parameter model folder (built on first use, ~10 s)."""
    from rllib_spear.cache_paths import cache_root
    from rllib_spear.models.factory import atomic_build_dir, build_tiny_model, conversation_texts, synthetic_conversations

    key = hashlib.sha256(json.dumps({**MODEL_20M, "v": 1}, sort_keys=True).encode()).hexdigest()[:16]
    final = Path(cache_dir) if cache_dir else cache_root()
    final = final / f"bench-qwen2-20m-{key}"
    if (final / "config.json").exists():
        return str(final)
    log(f"building the ~20M-parameter model in {final}")
    texts = conversation_texts(synthetic_conversations(300, seed=0))
    with atomic_build_dir(final) as tmp:
        build_tiny_model(tmp, texts, **MODEL_20M)
    return str(final)


def make_config(path: str, layout: str, *, mixed_precision, budget: int, group_size: int,
                tasks: int, threads: int):
    from rllib_spear import GRPOConfig

    sharding, n = LAYOUTS[layout]
    return (GRPOConfig().environment("search_qa")
            .env_runners(num_env_runners=0, max_model_len=1024, max_response_tokens=256)
            .training(group_size=group_size, tasks_per_iteration=tasks, lr=1e-5, loss_mode="vanilla",
                      entropy_coeff=0.0, response_filters=(), group_filter_keep_fraction=None,
                      micro_batch_token_budget=budget, torch_num_threads=threads)
            .rl_module(model_config={"model_path": path})
            .resources(num_cpus_for_main_process=0.25)
            .learners(num_learners=n, num_cpus_per_learner=0.5, sharding=sharding,
                      mixed_precision=mixed_precision)
            .debugging(seed=0))


def _rank_state(learner) -> dict:
    import torch.distributed as dist

    from torch.nn.parallel import DistributedDataParallel

    out = dict(learner.state_bytes())
    out["rank"] = dist.get_rank() if dist.is_initialized() else 0
    # DDP's reducer keeps its own flat gradient buckets (a second gradient copy unless
    # gradient_as_bucket_view): memory that state_bytes() does not count.
    for mid in learner.module.keys():
        m = learner.module[mid]
        if isinstance(m, DistributedDataParallel):
            try:
                data = m._get_ddp_logging_data()
                sizes = str(data.get("bucket_sizes", ""))
                out["ddp_bucket_bytes"] = sum(int(x) for x in sizes.split(",") if x.strip())
                out["ddp_gradient_as_bucket_view"] = bool(data.get("gradient_as_bucket_view", False))
            except Exception as e:  # private API: report, do not fail the benchmark
                out["ddp_bucket_error"] = f"{type(e).__name__}: {e}"
    return out


def run_layout(path, layout, trajs, args) -> dict:
    """Build the algorithm, replay ``trajs`` for 1 warm-up + ``args.iters`` iterations, return the
    per-rank state bytes and the timings."""
    sharding, n = LAYOUTS[layout]
    threads = args.threads or max(1, args.cores // n)
    cfg = make_config(path, layout, mixed_precision=args.mixed_precision, budget=args.budget,
                      group_size=args.group_size, tasks=len(trajs) // args.group_size, threads=threads)
    log(f"{layout}: building the algorithm ({n} learner rank(s), {sharding}, "
        f"mixed_precision={args.mixed_precision}, {threads} torch thread(s) per rank)")
    class Replay(TrajectoryCallback):  # every iteration trains on the same recorded batch
        def on_trajectories(self, *, trajectories, runner_stats, **kwargs):
            trajectories[:] = copy.deepcopy(trajs)
            runner_stats[:] = [{}]

    algo = cfg.callbacks(Replay).build_algo()
    try:
        iters = []
        for i in range(args.iters + 1):
            res = algo.train()
            lr = res["learners"]["default_policy"]
            it = {"update_s": float(res["learner_update_s"]), "train_tokens_per_s": float(res.get("train_tokens_per_s", float("nan"))),
                  "trained_tokens": float(lr.get("trained_tokens", float("nan"))),
                  "grad_norm": float(lr.get("grad_norm", float("nan"))),
                  "reported_bytes": {k: float(lr[k]) for k in ("param_bytes", "grad_bytes", "optimizer_bytes") if k in lr}}
            iters.append(it)
            log(f"{layout}: iteration {i + 1}/{args.iters + 1} {'(warm-up) ' if i == 0 else ''}"
                f"update {it['update_s']:.2f} s, {it['train_tokens_per_s']:.0f} tokens/s, "
                f"grad_norm {it['grad_norm']:.6g}")
        calls = algo.learner_group.foreach_learner(_rank_state)
        ranks = sorted((r.get() for r in calls.result_or_errors), key=lambda d: d["rank"])
    finally:
        algo.stop()
    timed = iters[1:] or iters
    tokens = sum(t.length for t in trajs)
    return {"layout": layout, "ranks": ranks, "iters": iters, "threads": threads,
            "tokens_per_update": tokens,
            "learner_tokens_per_s": tokens * len(timed) / sum(t["update_s"] for t in timed),
            "algo_train_tokens_per_s": float(np.mean([t["train_tokens_per_s"] for t in timed]))}


def _mib(x: float) -> str:
    return f"{x / MIB:8.2f}"


def print_report(results: dict, params: int, args) -> dict:
    print()
    print(f"model: random-init Qwen2, {params / 1e6:.2f}M parameters (fp32 master weights), "
          f"mixed_precision={args.mixed_precision}; batch {args.trajs} trajectories x ~{args.tokens} tokens, "
          f"1 optimizer step per update; CPU, gloo")
    print(f"{'layout':8} {'rank':>4} {'param MiB':>10} {'grad MiB':>9} {'optim MiB':>10} {'total MiB':>10}"
          f" {'DDP buckets MiB (not in total)':>31}")
    per_rank_total = {}
    for layout, r in results.items():
        for st in r["ranks"]:
            total = st["param_bytes"] + st["grad_bytes"] + st["optimizer_bytes"]
            per_rank_total.setdefault(layout, []).append(total)
            print(f"{layout:8} {st['rank']:>4} {_mib(st['param_bytes']):>10} {_mib(st['grad_bytes']):>9} "
                  f"{_mib(st['optimizer_bytes']):>10} {_mib(total):>10} "
                  f"{(_mib(st['ddp_bucket_bytes']) if 'ddp_bucket_bytes' in st else '-'):>31}")
    summary: dict = {}
    print()
    # RLlib's aggregation of the per-rank "max" metrics, against the per-rank numbers above
    for layout, r in results.items():
        if len(r["ranks"]) > 1 and r["iters"][-1]["reported_bytes"]:
            rep = r["iters"][-1]["reported_bytes"]
            rank_vals = {k: [st[k] for st in r["ranks"]] for k in rep}
            kind = {k: ("equal on every rank and reported once: max = mean = the per-rank value, not the sum"
                        if np.allclose(v, v[0]) and np.isclose(rep[k], v[0]) else
                        "max over ranks" if np.isclose(rep[k], max(v)) else
                        "sum over ranks" if np.isclose(rep[k], sum(v)) else
                        "mean over ranks" if np.isclose(rep[k], np.mean(v)) else "other")
                    for k, v in rank_vals.items()}
            print(f"{layout}: result['learners']['default_policy'] param/grad/optimizer_bytes = "
                  f"{', '.join(f'{rep[k] / MIB:.2f}' for k in rep)} MiB ({'; '.join(sorted(set(kind.values())))}); "
                  f"trained_tokens = {r['iters'][-1]['trained_tokens']:.0f} (the batch holds {r['tokens_per_update']}: "
                  f"{'summed over ranks' if r['iters'][-1]['trained_tokens'] == r['tokens_per_update'] else 'not the sum'})")
    if "ddp-2" in per_rank_total and "fsdp-2" in per_rank_total:
        ratio = max(per_rank_total["fsdp-2"]) / max(per_rank_total["ddp-2"])
        summary["fsdp2_over_ddp2_per_rank"] = ratio
        print(f"per-rank total FSDP-2 / DDP-2 = {ratio:.3f} (target <= 0.55: {'OK' if ratio <= 0.55 else 'ABOVE'})")
    if "ddp-1" in per_rank_total and "ddp-2" in per_rank_total:
        print(f"per-rank total DDP-2 / DDP-1 = {max(per_rank_total['ddp-2']) / max(per_rank_total['ddp-1']):.3f}"
              " (a full replica per rank)")
    print()
    print(f"{'layout':8} {'threads/rank':>12} {'learner tok/s':>14} {'algo train_tokens_per_s':>24} {'grad_norm (1st)':>16}")
    for layout, r in results.items():
        print(f"{layout:8} {r['threads']:>12} {r['learner_tokens_per_s']:>14.1f} {r['algo_train_tokens_per_s']:>24.1f} "
              f"{r['iters'][0]['grad_norm']:>16.7g}")
    if "ddp-2" in results and "fsdp-2" in results:
        sp = results["fsdp-2"]["learner_tokens_per_s"] / results["ddp-2"]["learner_tokens_per_s"]
        summary["fsdp2_over_ddp2_tokens_per_s"] = sp
        print(f"learner tokens/s FSDP-2 / DDP-2 = {sp:.3f}")
    gn = [r["iters"][0]["grad_norm"] for r in results.values()]
    if len(gn) > 1:
        spread = (max(gn) - min(gn)) / max(abs(np.mean(gn)), 1e-12)
        summary["first_grad_norm_rel_spread"] = spread
        print(f"first-iteration grad_norm, relative spread over layouts: {spread:.2e} (same batch, same init)")
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layouts", default="ddp-1,ddp-2,fsdp-1,fsdp-2")
    ap.add_argument("--mixed-precision", default=None, choices=[None, "bf16"],
                    help="learners(mixed_precision=...) for every layout (slow on CPU, see above)")
    ap.add_argument("--trajs", type=int, default=16, help="trajectories per iteration")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128, help="mean trajectory length")
    ap.add_argument("--budget", type=int, default=1024, help="micro_batch_token_budget")
    ap.add_argument("--iters", type=int, default=3, help="timed iterations (after 1 warm-up)")
    ap.add_argument("--cores", type=int, default=2, help="Ray CPUs")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads per learner rank (0: --cores split over the ranks)")
    ap.add_argument("--verbose", action="store_true", help="show the Ray workers' logs")
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()

    import ray

    import rllib_spear  # noqa: F401
    from learner_throughput import synthetic_trajectories

    path = model_20m_path(args.cache_dir)
    cfg = json.loads((Path(path) / "config.json").read_text())
    from transformers import AutoConfig, AutoModelForCausalLM

    with __import__("torch").device("meta"):
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path)).parameters())
    log(f"model {path}: {params / 1e6:.2f}M parameters, vocab {cfg['vocab_size']}")
    trajs = synthetic_trajectories(args.trajs, args.tokens, cfg["vocab_size"], seed=0, group_size=args.group_size)
    ray.init(num_cpus=args.cores, include_dashboard=False, log_to_driver=args.verbose,
             runtime_env={"env_vars": {"GLOO_SOCKET_IFNAME": "lo", "RAY_AUTH_MODE": "disabled",
                                       "TOKENIZERS_PARALLELISM": "false"}})
    results = {}
    try:
        for layout in [x.strip() for x in args.layouts.split(",") if x.strip()]:
            results[layout] = run_layout(path, layout, trajs, args)
            tot = max(s["param_bytes"] + s["grad_bytes"] + s["optimizer_bytes"] for s in results[layout]["ranks"])
            log(f"{layout}: done, per-rank total {tot / MIB:.2f} MiB, "
                f"{results[layout]['learner_tokens_per_s']:.1f} learner tokens/s")
    finally:
        ray.shutdown()
    summary = print_report(results, params, args)
    log("finished")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "summary": summary, "params": params,
                                               "args": vars(args)}, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
