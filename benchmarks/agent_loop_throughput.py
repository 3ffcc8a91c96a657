"""Episodes/s and generated tokens/s of the async agent loop vs the turn-synchronous one.

Both modes (``rollout_mode="turn_sync"``: ``MultiTurnRollout``; ``"async"``:
``AsyncMultiTurnRollout``, docs/design.md "The agent loop") run the same groups of the embedded
``search_qa`` task on the same engine, with a tool latency added before every env step
(``LatencyEnv``: it sleeps, then delegates to the real env):

* ``lognormal``: latency ~ exp(N(ln median, sigma)), median 0.1 s and sigma 1 by default (a remote
  retriever or an HTTP tool: mean 0.165 s, p95 0.52 s, a long tail). The draw is a function of
  (seed, env instance, episode of that instance, step), and both modes create and reuse their envs
  in the same order, so they wait the same latencies;
* ``zero``: no latency (the loop's own cost: BM25 search, tokenization, batching).

Per mode: episodes/s and generated tokens/s over all reps (episodes or tokens of every rep over
their summed wall time of ``run``), the engine's idle time (share of the loop's span with no
request in the engine), the engine calls (turn_sync: batched ``generate`` calls; async: requests,
and with the HF engine the batches its scheduler formed). Runs alternate between the modes, rep
``r`` samples with seed ``r`` in both. A zero-latency run lasts ~0.2 s and the two modes sample
different (identically distributed) episodes for one seed, so one rep's ratio swings by +-20%:
zero latency runs ``--zero-reps`` reps (40) and the ratio is over their totals. Targets on 2
cores: async >= 3x turn_sync episodes/s at the lognormal latency, >= 0.95x at zero.

    .venv/bin/python benchmarks/agent_loop_throughput.py [--engine hf|vllm] [--model embedded|tiny|PATH]
        [--tasks 8 --group 4 --max-new 48 --max-turns 3 --reps 2 --zero-reps 40] [--latency lognormal,zero]

``--engine vllm`` needs the engine's async path (``VLLMEngine(async_engine=True)``); both modes
then run on that one engine, so that only the loop differs. Without it the run says so and skips.
"""
from __future__ import annotations

import argparse
import itertools
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

MODES = ("turn_sync", "async")


class LatencyEnv:
    """Delegates to ``inner`` after sleeping a drawn latency before every ``step``."""

    def __init__(self, inner, instance: int, latency: str, median: float, sigma: float, seed: int):
        self.inner, self.instance = inner, instance
        self.latency, self.median, self.sigma, self.seed = latency, median, sigma, seed
        self.resets = self.steps = 0

    def draw(self) -> float:
        if self.latency == "zero":
            return 0.0
        rng = np.random.default_rng([self.seed, self.instance, self.resets, self.steps])
        return float(self.median * math.exp(self.sigma * rng.standard_normal()))

    def reset(self, task):
        self.resets += 1
        self.steps = 0
        return self.inner.reset(task)

    def step(self, text):
        self.steps += 1
        delay = self.draw()
        if delay > 0:
            time.sleep(delay)
        return self.inner.step(text)

    def episode_stats(self):
        return self.inner.episode_stats()

    def __getattr__(self, name):  # tool_schemas, system_prompt, ...
        return getattr(self.inner, name)


def env_factory(args, latency: str):
    """A fresh factory per rollout: instance ids count from 0 in both modes."""
    from rllib_spear.envs import make_env

    counter = itertools.count()
    return lambda: LatencyEnv(make_env("search_qa", max_turns=args.max_turns), next(counter), latency,
                              args.median, args.sigma, args.seed)


def make_rollout(mode, engine, tokenizer, args, latency):
    from rllib_spear.env_runners.rollout_modes import make_rollout as make
    from rllib_spear.env_runners.engines.base import SamplingConfig
    from rllib_spear.env_runners.rollout import RolloutConfig

    return make(mode, engine=engine, tokenizer=tokenizer, env_factory=env_factory(args, latency),
                sampling=SamplingConfig(temperature=1.0, max_new_tokens=args.max_new, seed=0),
                config=RolloutConfig(max_turns=args.max_turns, max_model_len=args.max_model_len,
                                     max_response_tokens=args.max_response),
                tool_concurrency=args.tool_concurrency, step_timeout_s=args.tool_timeout)


def run_once(rollout, tasks, args, seed):
    scheduler = rollout.engine.__dict__.get("_batching_scheduler")
    batches0 = scheduler.batches if scheduler is not None else 0
    rollout.sampling.seed = seed
    t0 = time.perf_counter()
    trajs, stats = rollout.run(tasks, args.group)
    wall = time.perf_counter() - t0
    scheduler = rollout.engine.__dict__.get("_batching_scheduler")
    batches = (scheduler.batches - batches0) if scheduler is not None else None
    loop = stats.loop_metrics()
    return {"eps": len(trajs) / wall, "tps": stats.generated_tokens / wall, "wall": wall,
            "tokens": stats.generated_tokens, "idle": stats.engine_idle_s, "idle_frac": stats.engine_idle_s / wall,
            "calls": stats.engine_calls, "batches": batches, "p50": loop["tool_latency_p50_s"],
            "p95": loop["tool_latency_p95_s"], "timeouts": stats.tool_timeouts, "episodes": len(trajs)}


def bench(engine, tokenizer, tasks, args, latency, label):
    rollouts = {m: make_rollout(m, engine, tokenizer, args, latency) for m in MODES}
    res = {m: [] for m in MODES}
    reps = args.reps if latency == "lognormal" else args.zero_reps
    for rep in range(reps + 1):  # rep 0 warms up both modes
        order = MODES if rep % 2 == 0 else MODES[::-1]
        for m in order:
            r = run_once(rollouts[m], tasks, args, seed=rep)
            if rep:
                res[m].append(r)
    med = {m: {k: statistics.median(r[k] for r in res[m]) for k in ("idle", "idle_frac", "wall")} for m in MODES}
    for m in MODES:  # throughput over all reps: totals over the summed wall time
        wall = sum(r["wall"] for r in res[m])
        med[m]["eps"] = sum(r["episodes"] for r in res[m]) / wall
        med[m]["tps"] = sum(r["tokens"] for r in res[m]) / wall
    for m in MODES:
        last = res[m][-1]
        batches = f", {last['batches']} batches" if m == "async" and last["batches"] is not None else ""
        print(f"[{label}] {m:9s} {med[m]['eps']:7.2f} episodes/s {med[m]['tps']:8.1f} tok/s | wall "
              f"{med[m]['wall']:6.2f}s, engine idle {med[m]['idle']:6.2f}s ({100 * med[m]['idle_frac']:4.1f}%) | "
              f"last rep: {last['episodes']} episodes, {last['tokens']} tokens, {last['calls']} engine calls{batches}, "
              f"tool p50 {last['p50']:.3f}s p95 {last['p95']:.3f}s, timeouts {last['timeouts']}")
    ratio_e = med["async"]["eps"] / med["turn_sync"]["eps"]
    ratio_t = med["async"]["tps"] / med["turn_sync"]["tps"]
    target = 3.0 if latency == "lognormal" else 0.95
    print(f"[{label}] async / turn_sync: {ratio_e:.2f}x episodes/s, {ratio_t:.2f}x tok/s "
          f"(target >= {target}x: {'OK' if ratio_e >= target else 'BELOW'})")
    return ratio_e


def build_engine(args, path):
    if args.engine == "hf":
        from rllib_spear.env_runners.engines.hf_engine import HFEngine

        return HFEngine(path, device=args.device)
    from rllib_spear.env_runners.engines.vllm_engine import VLLMEngine

    return VLLMEngine(path, seed=0, max_model_len=args.max_model_len, async_engine=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="hf", choices=("hf", "vllm"))
    ap.add_argument("--model", default="embedded", help="embedded | tiny | a model folder")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--max-response", type=int, default=512)
    ap.add_argument("--reps", type=int, default=2, help="reps at the lognormal latency")
    ap.add_argument("--zero-reps", type=int, default=40, help="reps at zero latency (short, noisy runs)")
    ap.add_argument("--latency", default="lognormal,zero", help="comma list of lognormal, zero")
    ap.add_argument("--median", type=float, default=0.1, help="lognormal median latency, s")
    ap.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma")
    ap.add_argument("--seed", type=int, default=0, help="latency draws")
    ap.add_argument("--tool-concurrency", type=int, default=None, help="async: None = one per episode")
    ap.add_argument("--tool-timeout", type=float, default=300.0,
                    help="the env-step watchdog, s (step_timeout_s: async times the tool call out, turn_sync ends the episode)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    latencies = [s.strip() for s in args.latency.split(",") if s.strip()]
    bad = sorted(set(latencies) - {"lognormal", "zero"})
    if bad:
        ap.error(f"--latency: unknown {bad}; use lognormal and/or zero")

    from rllib_spear.envs import load_tasks

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from rollout_throughput import model_path_of  # the same model names as the rollout benchmark

    path = model_path_of(args.model)
    if args.engine == "vllm":
        try:
            import vllm  # noqa: F401
        except Exception as exc:  # noqa: BLE001
            print(f"[vllm] skipped: import vllm failed ({type(exc).__name__}: {exc})")
            return
    engine = build_engine(args, path)
    tokenizer = engine.tokenizer
    if not hasattr(tokenizer, "apply_chat_template"):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    tasks = load_tasks("search_qa", "train")[: args.tasks]
    print(f"engine={args.engine} model={path} device={args.device} tasks={len(tasks)} x group={args.group} "
          f"max_new={args.max_new} max_turns={args.max_turns} torch threads={torch.get_num_threads()} "
          f"latency={latencies} (lognormal median {args.median}s sigma {args.sigma}) reps={args.reps} "
          f"zero-reps={args.zero_reps}")
    try:
        for latency in latencies:
            bench(engine, tokenizer, tasks, args, latency, f"{args.engine}, {latency}")
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
