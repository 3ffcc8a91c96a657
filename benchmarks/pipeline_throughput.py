"""Trained tokens/s and iterations/s of ``rollout_pipeline="one_step_off"`` vs ``"sync"``
(docs/design.md "Rollout pipelining"): GRPO on the embedded ``search_qa`` task, 2 remote
LLMEnvRunners, the learner in the driver, everything on CPU.

    .venv/bin/python benchmarks/pipeline_throughput.py [--model tiny|embedded|PATH]
        [--iters 4 --warmup 1 --tasks 4 --group 4 --max-new 24 --max-turns 2]

Per mode: build, ``--warmup`` untimed iterations (one_step_off's first iteration samples without
overlap, and the first updates warm up torch), then ``--iters`` timed ``train()`` calls. Trained
tokens are the prompt + response tokens of the rows the learner trained (``train_tokens_per_s *
learner_update_s`` of every iteration); tokens/s divides their sum by the wall time of the timed
calls. Prints both modes and the one_step_off / sync ratios.

What limits it on 2 cores: while they overlap, the two runners (one torch thread each) and the
learner in the driver (torch's default threads: every core) oversubscribe two cores, so the
update and the sample slow each other down (and busy neighbours on a shared machine slow both);
the ideal gain, iteration time (sample + update) -> max(sample, update), needs a core (or GPU)
per process. one_step_off also turns truncated IS on (tis_cap=None -> 2.0), so its update makes
one more forward pass (the logp_old recomputation). The gain shrinks further when one phase
dominates: the iteration cannot be shorter than the longer phase. Measured on the 2-core dev
machine (defaults above, other jobs running): sync 1650 trained tokens/s, 0.376 it/s;
one_step_off 753 tokens/s, 0.171 it/s (0.46x): the update went from 1.75 s to 5.0 s.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rollout_throughput import model_path_of  # noqa: E402  (one resolver of --model names)


def build(mode: str, a: argparse.Namespace, model_path: str):
    from rllib_spear import GRPOConfig

    cfg = (GRPOConfig().environment("search_qa")
           .env_runners(num_env_runners=2, num_cpus_per_env_runner=0.5, max_new_tokens=a.max_new,
                        max_turns=a.max_turns, max_model_len=512, max_response_tokens=256)
           .resources(num_cpus_for_main_process=0.5)
           .training(group_size=a.group, tasks_per_iteration=a.tasks, lr=1e-5, rollout_pipeline=mode)
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
    a = ap.parse_args()

    import ray

    import rllib_spear  # noqa: F401  (registers the algorithms)

    model_path = model_path_of(a.model)
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             runtime_env={"env_vars": {"GLOO_SOCKET_IFNAME": "lo", "RAY_AUTH_MODE": "disabled"}})
    try:
        out = {mode: run_mode(mode, a, model_path) for mode in ("sync", "one_step_off")}
    finally:
        ray.shutdown()
    print(f"\n{a.iters} timed iterations after {a.warmup} warmup, {a.tasks} tasks x G={a.group}, "
          f"max_new_tokens={a.max_new}, max_turns={a.max_turns}, model {a.model}, 2 runners, 2 CPUs")
    for mode, m in out.items():
        print(f"{mode:>13}: {m['tokens_per_s']:8.1f} trained tokens/s  {m['it_per_s']:.3f} it/s  "
              f"(wall {m['wall_s']:.1f} s, update {m['update_s']:.2f} s/it, sample wait "
              f"{m['sample_wait_s']:.2f} s/it, lag max {m['lag_max']:.0f})")
    s, o = out["sync"], out["one_step_off"]
    print(f"one_step_off / sync: {o['tokens_per_s'] / s['tokens_per_s']:.2f}x trained tokens/s, "
          f"{o['it_per_s'] / s['it_per_s']:.2f}x it/s")


if __name__ == "__main__":
    main()
