"""Trained tokens/s and iterations/s of the rollout pipelines (docs/design.md "Rollout pipelining",
"Fully asynchronous training"): ``sync``, ``one_step_off`` and ``async`` with ``max_policy_lag`` 1
and 2, GRPO on the embedded ``search_qa`` task with a tool latency drawn before every env step
(lognormal, median 0.1 s, sigma 1: a remote retriever), 2 remote LLMEnvRunners, the learner in the
driver, everything on CPU.

    .venv/bin/python benchmarks/pipeline_throughput.py [--model tiny|embedded|PATH]
        [--modes sync_turn,sync,one_step_off,async1,async2] [--latency lognormal|zero]
        [--iters 4 --warmup 1 --tasks 4 --group 4 --max-new 24 --max-turns 2]

Modes: ``sync_turn`` is the default run (sync pipeline, turn-synchronous loop); the others use the
async agent loop (``rollout_mode="async"``), so that they differ only in the pipeline;
``asyncK`` is ``rollout_pipeline="async"`` with ``max_policy_lag=K``. Per mode: build,
``--warmup`` untimed iterations (the first update warms up torch; a pipeline's first batch has no
overlap), then ``--iters`` timed ``train()`` calls. Trained tokens are the prompt + response
tokens of the rows the learner trained (``train_tokens_per_s * learner_update_s`` of every
iteration); tokens/s divides their sum by the wall time of the timed calls. Prints every mode and
its ratio to ``sync`` (target: async with k = 2 >= 1.5x sync).

What limits it on 2 cores: the two runners (one torch thread each) and the learner in the driver
share two cores, so whatever overlaps slows the rest down; the tool latency is where the overlap
is free (a runner waiting for its tool costs no core), which is what a pipeline hides. The
``one_step_off`` and ``async`` updates also make one more forward pass (truncated IS is on:
logp_old is recomputed).
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rollout_throughput import model_path_of  # noqa: E402  (one resolver of --model names)

import numpy as np  # noqa: E402

from rllib_spear.envs.search_envs import SearchQAEnv  # noqa: E402

#: mode -> (rollout_pipeline, rollout_mode, max_policy_lag)
MODES = {
    "sync_turn": ("sync", "turn_sync", 1),
    "sync": ("sync", "async", 1),
    "one_step_off": ("one_step_off", "async", 1),
    "async1": ("async", "async", 1),
    "async2": ("async", "async", 2),
}


class LatencySearchQA(SearchQAEnv):
    """``search_qa`` with a tool latency slept before every step: lognormal (``median`` x
    exp(``sigma`` N(0, 1)), drawn from the process, the env instance and the step) or zero.
    Defined in the script, so Ray ships the class to the runners by value."""

    _instances = 0

    def __init__(self, latency: str = "lognormal", median: float = 0.1, sigma: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.latency, self.median, self.sigma = latency, float(median), float(sigma)
        LatencySearchQA._instances += 1
        self._rng = np.random.default_rng([os.getpid(), LatencySearchQA._instances])

    def step(self, text):
        if self.latency == "lognormal":
            time.sleep(self.median * math.exp(self.sigma * self._rng.standard_normal()))
        return super().step(text)


def build(mode: str, a: argparse.Namespace, model_path: str):
    from rllib_spear import GRPOConfig

    pipeline, loop, lag = MODES[mode]
    cfg = (GRPOConfig().environment(env=LatencySearchQA, dataset="search_qa",
                                    env_config={"latency": a.latency, "median": a.median, "sigma": a.sigma})
           .env_runners(num_env_runners=2, num_cpus_per_env_runner=0.5, max_new_tokens=a.max_new,
                        max_turns=a.max_turns, max_model_len=512, max_response_tokens=256, rollout_mode=loop)
           .resources(num_cpus_for_main_process=0.5)
           .training(group_size=a.group, tasks_per_iteration=a.tasks, lr=1e-5, rollout_pipeline=pipeline,
                     max_policy_lag=lag)
           .rl_module(model_config={"model_path": model_path})
           .debugging(seed=0))
    return cfg.build_algo()


def run_mode(mode: str, a: argparse.Namespace, model_path: str) -> dict[str, float]:
    algo = build(mode, a, model_path)
    try:
        for _ in range(a.warmup):
            algo.train()
        results = []
        t0 = time.perf_counter()
        for _ in range(a.iters):
            results.append(algo.train())
        wall = time.perf_counter() - t0
    finally:
        algo.stop()
    tokens = sum(r["train_tokens_per_s"] * r["learner_update_s"] for r in results)
    return {
        "wall_s": wall,
        "it_per_s": a.iters / wall,
        "tokens_per_s": tokens / wall,
        "update_s": statistics.mean(r["learner_update_s"] for r in results),
        "sample_wait_s": statistics.mean(r["env_runners"]["sample_time_s"] for r in results),
        "lag_max": max(r["env_runners"]["policy_version_lag_max"] for r in results),
        "dropped": sum(r.get("dropped_stale_trajectories", 0) for r in results),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--iters", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-new", type=int, default=24)
    ap.add_argument("--max-turns", type=int, default=2)
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    ap.add_argument("--latency", default="lognormal", choices=("lognormal", "zero"))
    ap.add_argument("--median", type=float, default=0.1, help="lognormal median latency, s")
    ap.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma")
    a = ap.parse_args()
    modes = [m for m in a.modes.split(",") if m]
    bad = sorted(set(modes) - set(MODES))
    if bad:
        ap.error(f"--modes: unknown {bad}; choose from {list(MODES)}")

    import ray

    import rllib_spear  # noqa: F401  (registers the algorithms)

    model_path = model_path_of(a.model)
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             runtime_env={"env_vars": {"GLOO_SOCKET_IFNAME": "lo", "RAY_AUTH_MODE": "disabled"}})
    try:
        out = {}
        for mode in modes:
            print(f"[pipeline_throughput] {mode} ...", flush=True)
            out[mode] = run_mode(mode, a, model_path)
    finally:
        ray.shutdown()
    print(f"\n{a.iters} timed iterations after {a.warmup} warmup, {a.tasks} tasks x G={a.group}, "
          f"max_new_tokens={a.max_new}, max_turns={a.max_turns}, model {a.model}, 2 runners, 2 CPUs, "
          f"tool latency {a.latency}" + (f" (median {a.median} s, sigma {a.sigma})" if a.latency == "lognormal" else ""))
    base = out.get("sync")
    for mode, m in out.items():
        ratio = f"  {m['tokens_per_s'] / base['tokens_per_s']:.2f}x sync" if base else ""
        print(f"{mode:>13}: {m['tokens_per_s']:8.1f} trained tokens/s  {m['it_per_s']:.3f} it/s{ratio}  "
              f"(wall {m['wall_s']:.1f} s, update {m['update_s']:.2f} s/it, sample wait "
              f"{m['sample_wait_s']:.2f} s/it, lag max {m['lag_max']:.0f}, dropped stale {m['dropped']:.0f})")
    if base and "async2" in out:
        r = out["async2"]["tokens_per_s"] / base["tokens_per_s"]
        print(f"async (k=2) / sync: {r:.2f}x trained tokens/s (target >= 1.5x: {'met' if r >= 1.5 else 'NOT met'})")


if __name__ == "__main__":
    main()
