"""Learning benchmark: GRPO vs Dr.BoT vs SPEAR (and SPADER vs GRPO on multi-answer search) on
the embedded tasks, from the same cold-start checkpoint, through the public API
(``tune.Tuner`` with the registered names).

    python benchmarks/learning_curves.py                 # full: 3 seeds, ablations (about an hour on 2 cores)
    python benchmarks/learning_curves.py --quick         # 1 seed, few iterations (< 10 minutes)

Writes to --out (default benchmarks/out/learning_curves):
  runs.csv      per-iteration metrics of every run (algorithm, variant, seed, iteration, ...)
  curves.png    success / F1 and tool-call rate vs iteration (mean with a min-max band over seeds)
  entropy.png   entropy vs iteration
  table.md      final success (mean +- std over seeds), iterations to reach Dr.BoT's final
                success, and the papers' numbers for reference
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

PAPER_NOTES = {
    "GRPO-LLM": "ALFWorld 72.8 / WebShop 56.8 (Qwen2.5-1.5B, SPEAR paper)",
    "DrBoT": "ALFWorld 90.6 / WebShop 68.8 (Dr.BoT(GiGPO), 1.5B)",
    "SPEAR": "ALFWorld 88.9 / WebShop 77.5 (GRPO+SPEAR); 93.2 / 81.1 (Dr.BoT(GiGPO)+SPEAR)",
    "SPADER": "QAMPARI recall/F1 above outcome-reward GRPO (SPADER paper)",
}

# variant name -> (registered algorithm, training() overrides)
MAIN = {
    "GRPO": ("GRPO-LLM", {}),
    "DrBoT": ("DrBoT", {}),
    "SPEAR": ("SPEAR", {}),
}
ABLATIONS = {
    "SPEAR-noSIL": ("SPEAR", {"sil_enabled": False}),
    "SPEAR-noToolBonus": ("SPEAR", {"tool_reward_schedule": "none"}),
    "SPEAR-noClipCov": ("SPEAR", {"loss_mode": "vanilla"}),
    "SPEAR-continuous": ("SPEAR", {"sil_trigger": "continuous", "sil_replay_batch_size": 16}),
    "SPEAR-joint": ("SPEAR", {"sil_update": "joint"}),
}
MULTI = {
    "GRPO-multi": ("GRPO-LLM", {}),
    "SPADER": ("SPADER", {}),
}

METRICS = {
    "success": "env_runners/success_rate",
    "f1": "env_runners/f1_mean",
    "reward": "env_runners/reward_total_mean",
    "tool_call_rate": "env_runners/tool_call_rate",
    "entropy": "learners/default_policy/entropy",
    "response_length": "env_runners/response_length_mean",
}


def build_config(algo: str, overrides: dict[str, Any], env: str, seed: int, args) -> Any:
    from rllib_spear.registration import algorithm_classes

    cfg = algorithm_classes()[algo].get_default_config()
    cfg.environment(env, env_config={"max_turns": args.max_turns})
    cfg.env_runners(num_env_runners=1, engine="hf", temperature=1.0, max_new_tokens=48,
                    max_turns=args.max_turns, max_model_len=768, max_response_tokens=384)
    train = {"group_size": args.group_size, "tasks_per_iteration": args.tasks, "lr": args.lr,
             # schedules scaled to the short run (the papers use 200 steps)
             "tool_reward_steps": max(args.iterations // 2, 1),
             "sil_weight_steps": max(args.iterations // 2, 1),
             "sil_capacity": args.sil_capacity,
             "cost_free_steps": max(args.iterations // 3, 0), "cost_rampup_steps": max(args.iterations // 3, 0)}
    own = cfg._own_training_keys()
    train = {k: v for k, v in train.items() if k in own or k in ("lr",)}
    train.update(overrides)
    cfg.training(**train)
    cfg.rl_module(model_config={"model_path": args.model_path})
    cfg.debugging(seed=seed)
    cfg.validate()
    return cfg


def run_variant(name: str, algo: str, overrides: dict, env: str, seeds: list[int], args) -> list[dict]:
    from ray import tune

    rows = []
    for seed in seeds:
        cfg = build_config(algo, overrides, env, seed, args)
        t0 = time.time()
        grid = tune.Tuner(algo, param_space=cfg, run_config=tune.RunConfig(
            name=f"{name}-s{seed}", storage_path=str(Path(args.out).resolve() / "tune"),
            stop={"training_iteration": args.iterations}, verbose=0)).fit()
        res = grid[0]
        if res.error:
            raise RuntimeError(f"{name} seed {seed} failed: {res.error}")
        df = res.metrics_dataframe
        for _, r in df.iterrows():
            row = {"variant": name, "algorithm": algo, "env": env, "seed": seed,
                   "iteration": int(r["training_iteration"])}
            for k, col in METRICS.items():
                row[k] = float(r[col]) if col in df.columns and r[col] == r[col] else np.nan
            rows.append(row)
        print(f"{name:<20} seed {seed}: final success {rows[-1]['success']:.3f} "
              f"tool rate {rows[-1]['tool_call_rate']:.3f} ({time.time() - t0:.0f}s)", flush=True)
    return rows


def final_value(df, variant: str, metric: str, last: int = 3) -> tuple[float, float, list[float]]:
    """Mean of the last `last` iterations per seed, then mean and std over seeds."""
    per_seed = []
    for _, g in df[df.variant == variant].groupby("seed"):
        per_seed.append(float(g.sort_values("iteration")[metric].tail(last).mean()))
    return float(np.mean(per_seed)), float(np.std(per_seed)), per_seed


def iterations_to_reach(df, variant: str, metric: str, target: float, window: int = 3) -> float:
    """Mean over seeds of the first iteration whose trailing-window mean reaches `target`
    (nan if never)."""
    its = []
    for _, g in df[df.variant == variant].groupby("seed"):
        s = g.sort_values("iteration")
        sm = s[metric].rolling(window, min_periods=1).mean().to_numpy()
        hit = np.nonzero(sm >= target)[0]
        its.append(float(s["iteration"].to_numpy()[hit[0]]) if len(hit) else np.nan)
    return float(np.nanmean(its)) if not all(np.isnan(its)) else float("nan")


def write_outputs(df, out: Path, seeds: list[int], wall_s: float, args) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df.to_csv(out / "runs.csv", index=False)
    envs = list(dict.fromkeys(df.env))
    fig, axes = plt.subplots(len(envs), 2, figsize=(11, 4 * len(envs)), squeeze=False)
    for i, env in enumerate(envs):
        sub = df[df.env == env]
        metric = "f1" if env == "multi_answer_search" else "success"
        for j, m in enumerate((metric, "tool_call_rate")):
            ax = axes[i][j]
            for v, g in sub.groupby("variant", sort=False):
                piv = g.pivot_table(index="iteration", columns="seed", values=m)
                mean = piv.mean(axis=1)
                ax.plot(mean.index, mean.values, label=v)
                ax.fill_between(mean.index, piv.min(axis=1), piv.max(axis=1), alpha=0.15)
            ax.set_title(f"{env}: {m}")
            ax.set_xlabel("iteration")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)
    fig, ax = plt.subplots(figsize=(6, 4))
    for v, g in df.groupby("variant", sort=False):
        piv = g.pivot_table(index="iteration", columns="seed", values="entropy")
        ax.plot(piv.index, piv.mean(axis=1), label=v)
    ax.set_title("entropy"); ax.set_xlabel("iteration"); ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "entropy.png", dpi=110)

    lines = [f"Seeds {seeds}, {args.iterations} iterations of {args.tasks} tasks x {args.group_size} "
             f"samples, lr {args.lr}, wall time {wall_s / 60:.1f} min.", "",
             "| variant | task | final success / F1 (mean +- std) | iterations to reach Dr.BoT's final | paper (reference) |",
             "|---|---|---|---|---|"]
    search = df[df.env == "search_qa"]
    target = final_value(search, "DrBoT", "success")[0] if "DrBoT" in set(search.variant) else float("nan")
    for v in dict.fromkeys(df.variant):
        env = df[df.variant == v].env.iloc[0]
        metric = "f1" if env == "multi_answer_search" else "success"
        mean, std, _ = final_value(df, v, metric)
        reach = iterations_to_reach(df, v, metric, target) if env == "search_qa" else float("nan")
        algo = df[df.variant == v].algorithm.iloc[0]
        lines.append(f"| {v} | {env} | {mean:.3f} +- {std:.3f} | "
                     f"{'-' if np.isnan(reach) else f'{reach:.1f}'} | {PAPER_NOTES.get(algo, '')} |")
    table = "\n".join(lines)
    (out / "table.md").write_text(table + "\n")
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 seed, 6 iterations, main variants only")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--sil-capacity", type=int, default=8)
    ap.add_argument("--no-ablations", action="store_true")
    ap.add_argument("--no-multi", action="store_true", help="skip SPADER vs GRPO on multi-answer search")
    ap.add_argument("--model-path", default="embedded")
    ap.add_argument("--out", default="benchmarks/out/learning_curves")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.iterations, args.no_ablations, args.no_multi = 1, 6, True, True
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import pandas as pd
    import ray

    import rllib_spear  # noqa: F401  (registers the algorithms)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.model_path == "embedded":
        from rllib_spear.models.sft import default_policy_path

        args.model_path = default_policy_path()  # the same cold-start checkpoint for every run
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True)
    seeds = list(range(args.seeds))
    t0 = time.time()
    rows: list[dict] = []
    plan = dict(MAIN)
    if not args.no_ablations:
        plan.update(ABLATIONS)
    for name, (algo, over) in plan.items():
        rows += run_variant(name, algo, over, "search_qa", seeds, args)
    if not args.no_multi:
        for name, (algo, over) in MULTI.items():
            rows += run_variant(name, algo, over, "multi_answer_search", seeds, args)
    table = write_outputs(pd.DataFrame(rows), out, seeds, time.time() - t0, args)
    print(table)
    print(f"wrote {out}/runs.csv, curves.png, entropy.png, table.md in {(time.time() - t0) / 60:.1f} min")


if __name__ == "__main__":
    main()
