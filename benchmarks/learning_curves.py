"""Learning benchmark: GRPO vs Dr.BoT vs SPEAR (and SPADER vs GRPO on multi-answer search) on
the embedded tasks, from the same cold-start checkpoint, through the public API
(``tune.Tuner`` with the registered names).

    python benchmarks/learning_curves.py            # full (< 60 min on 2 cores): main 3 seeds,
                                                    # ablations and SPADER vs GRPO 1 seed each
    python benchmarks/learning_curves.py --quick    # 1 seed, main variants, 40 iterations (< 10 min)
    python benchmarks/learning_curves.py --variants SPEAR,SPEAR-noSIL --seeds 3   # a subset
    python benchmarks/learning_curves.py --suite text_game   # GRPO vs GiGPO vs Dr.BoT(GiGPO)+SPEAR
                                                    # on the embedded text game, 3 seeds

Writes to --out (default benchmarks/out/learning_curves):
  runs.csv      per-iteration metrics of every run (algorithm, variant, seed, iteration, ...)
  curves.png    success / F1 and tool-call rate vs iteration (mean with a min-max band over seeds)
  entropy.png   entropy vs iteration
  table.md      final success (mean +- std over seeds), iterations to reach Dr.BoT's final
                success, the papers' numbers for reference, and the issue's must-show checks
"""
from __future__ import annotations

import argparse
import json
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
    "GRPO-multi": "the SPADER paper's outcome-reward baseline",
    "GRPO-game": "ALFWorld 72.8 (GRPO, Qwen2.5-1.5B, SPEAR paper)",
    "GiGPO-game": "ALFWorld 86.1 (GiGPO, Qwen2.5-1.5B, SPEAR README)",
    "SPEAR-GiGPO-game": "ALFWorld 93.2 (Dr.BoT(GiGPO)+SPEAR, 1.5B)",
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
# the text game (the stand-in of ALFWorld): outcome GRPO, GiGPO on the same GRPO algorithm (only the
# estimator changes), and SPEAR (Dr.BoT tricks + SIL + tool bonus) on GiGPO as in the released
# ALFWorld script (configs/spear_qwen2.5_1.5b_text_game.yaml). All three in the agent tree's form:
# group statistics over step rows (docs/algorithms.md 1.1), SIL admitting steps (2.2), and (build_config,
# --game-layout) one sample per step with 2 steps of history
TEXT_GAME = {
    "GRPO-game": ("GRPO-LLM", {"group_stats_over": "steps"}),
    "GiGPO-game": ("GRPO-LLM", {"advantage_estimator": "gigpo", "group_stats_over": "steps"}),
    "SPEAR-GiGPO-game": ("SPEAR", {"advantage_estimator": "gigpo", "group_stats_over": "steps",
                                   "sil_admission": "step"}),
}
#: the text game's per-step sample in the window layout: a step prompt of the embedded tokenizer is
#: at most ~770 tokens with 2 steps of history; the embedded model's positions stop at 2048
TEXT_GAME_WINDOW = {"history_steps": 2, "max_prompt_tokens": 1536}
#: the suites of ``--suite``: main = the search benchmark (main variants, ablations, multi-answer)
SUITES = ("main", "text_game")
#: turns of a text-game episode: the scripted solutions of the embedded train games take 3 to 8
TEXT_GAME_MAX_TURNS = 8
#: per task, the baseline whose final success the table's "iterations to reach" column targets
REACH_BASELINE = {"search_qa": ("DrBoT", "Dr.BoT"), "text_game": ("GRPO-game", "GRPO")}

METRICS = {
    "success": "env_runners/success_rate",
    "f1": "env_runners/f1_mean",
    "reward": "env_runners/reward_total_mean",
    "tool_call_rate": "env_runners/tool_call_rate",
    "tool_calls": "env_runners/tool_calls_per_episode",
    "recall": "env_runners/recall_mean",
    "precision": "env_runners/precision_mean",
    "entropy": "learners/default_policy/entropy",
    "response_length": "env_runners/response_length_mean",
}


def max_turns_of(env: str, args) -> int:
    """Turns per episode: ``--max-turns``, else 3 (search) or ``TEXT_GAME_MAX_TURNS``."""
    if args.max_turns is not None:
        return args.max_turns
    return TEXT_GAME_MAX_TURNS if env == "text_game" else 3


def token_budgets(env: str, turns: int) -> tuple[int, int, int]:
    """(max_model_len, max_response_tokens, max_new_tokens) of an episode of ``env``."""
    if env == "search_qa":
        return 768, 384, 48
    if env == "text_game":
        # a turn is <= 53 tokens in the demonstrations, an observation (feedback and the
        # admissible actions) <= ~180: 8 turns hold a scripted solution (<= 8 steps); the
        # embedded policy's positions stop at 2048
        response = min(256 * turns, 1792)
        return response + 256, response, 64
    # a multi-answer episode: up to turns - 1 searches (~125 tokens each), then a list of up to
    # 8 entities in one turn (up to ~51 tokens in the demonstrations): 512 tokens at 3 turns
    response = 128 * (turns - 1) + 256
    return response + 512, response, 64


def build_config(algo: str, overrides: dict[str, Any], env: str, seed: int, args) -> Any:
    from rllib_spear.coldstart import task_policy_env_config
    from rllib_spear.registration import algorithm_classes

    cfg = algorithm_classes()[algo].get_default_config()
    turns = max_turns_of(env, args)
    # multi-answer search with the call format its cold start was trained on (<search>, 3 passages)
    env_config = {} if env == "search_qa" else task_policy_env_config(env)
    cfg.environment(env, env_config={**env_config, "max_turns": turns})
    max_model_len, max_response, max_new = token_budgets(env, turns)
    cfg.env_runners(num_env_runners=1, engine="hf", temperature=1.0, max_new_tokens=max_new,
                    max_turns=turns, max_model_len=max_model_len, max_response_tokens=max_response)
    if env == "text_game" and getattr(args, "game_layout", "full") == "window":
        # one sample per step (the released agent tree): prompt + one action; the response budget
        # (and T_norm) is the action's
        window = TEXT_GAME_WINDOW
        cfg.env_runners(step_context="window", max_model_len=window["max_prompt_tokens"] + max_new,
                        max_response_tokens=max_new, **window)
    train = {"group_size": args.group_size, "tasks_per_iteration": args.tasks, "lr": args.lr,
             # schedules scaled to the short run (the papers use 200 steps)
             "tool_reward_steps": max(args.iterations // 2, 1),
             "sil_weight_steps": max(args.iterations // 2, 1),
             "sil_capacity": args.sil_capacity,
             "cost_free_steps": max(args.iterations // 3, 0), "cost_rampup_steps": max(args.iterations // 3, 0),
             # sampling and learning alternate: each may use every core of the machine
             "torch_num_threads": args.cpus}
    own = cfg.training_keys()
    train = {k: v for k, v in train.items() if k in own or k in ("lr",)}
    train.update(overrides)
    cfg.training(**train)
    # the cold start of the task (read lazily: real_model_learning.py's args name only its own)
    model = getattr(args, {"search_qa": "model_path", "text_game": "game_model_path"}.get(env, "multi_model_path"))
    cfg.rl_module(model_config={"model_path": model})
    cfg.debugging(seed=seed)
    cfg.validate()
    return cfg


def _progress_callback(label: str, every: int = 1):
    """A Tune callback printing one line per ``every`` iterations of a trial (Tune runs with
    verbose=0 here, and a trial of a large model takes minutes)."""
    from ray.tune import Callback

    class _Progress(Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            it = int(result.get("training_iteration", 0))
            if it % every == 0:
                e = result.get("env_runners", {})
                print(f"  {label} iteration {it}: success {e.get('success_rate', float('nan')):.3f}, "
                      f"tool-call rate {e.get('tool_call_rate', float('nan')):.2f} "
                      f"({result.get('time_this_iter_s', float('nan')):.0f} s)", flush=True)

    return _Progress()


def run_variant(name: str, algo: str, overrides: dict, env: str, seeds: list[int], args,
                build=None) -> list[dict]:
    """Train `name` once per seed through tune.Tuner; `build` (default `build_config`) makes each
    trial's config."""
    from ray import tune

    rows = []
    for seed in seeds:
        cfg = (build or build_config)(algo, overrides, env, seed, args)
        t0 = time.time()
        grid = tune.Tuner(algo, param_space=cfg, run_config=tune.RunConfig(
            name=f"{name}-s{seed}", storage_path=str(Path(args.out).resolve() / "tune"),
            stop={"training_iteration": args.iterations}, verbose=0,
            callbacks=[_progress_callback(f"{name} seed {seed}", getattr(args, "progress_every", 10))])).fit()
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
        metric = "f1" if env == "multi_answer_search" else "success"
        print(f"{name:<20} seed {seed}: final {metric} {rows[-1][metric]:.3f} "
              f"tool rate {rows[-1]['tool_call_rate']:.3f} ({time.time() - t0:.0f}s)", flush=True)
    return rows


def final_value(df, variant: str, metric: str, last: int = 10) -> tuple[float, float, list[float]]:
    """Mean of the last `last` iterations per seed (one iteration is only 64 episodes, so a single
    one is +-0.05 noise), then mean and std over seeds."""
    per_seed = []
    for _, g in df[df.variant == variant].groupby("seed"):
        per_seed.append(float(g.sort_values("iteration")[metric].tail(last).mean()))
    return float(np.mean(per_seed)), float(np.std(per_seed)), per_seed


def iterations_to_reach(df, variant: str, metric: str, target: float, window: int = 3) -> tuple[float, int, int]:
    """(mean over seeds of the first iteration whose trailing-window mean reaches `target`,
    seeds that reached it, seeds). A seed that never reaches it counts as its last iteration, so
    the mean is then a lower bound (nan if no seed reaches it)."""
    its, reached = [], 0
    for _, g in df[df.variant == variant].groupby("seed"):
        s = g.sort_values("iteration")
        sm = s[metric].rolling(window, min_periods=1).mean().to_numpy()
        hit = np.nonzero(sm >= target - 1e-9)[0]  # a baseline reaches its own final despite rounding
        reached += bool(len(hit))
        its.append(float(s["iteration"].to_numpy()[hit[0] if len(hit) else -1]))
    return (float(np.mean(its)) if reached else float("nan")), reached, len(its)


def _reach_text(mean: float, reached: int, seeds: int) -> str:
    if np.isnan(mean):
        return f"never (0/{seeds})"
    return f"{'>= ' if reached < seeds else ''}{mean:.1f} ({reached}/{seeds})"


def write_outputs(df, out: Path, wall_s: float, args, checks=None) -> str:
    """Write runs.csv, the plots and table.md under ``out``; return the table. ``checks``: a
    function (df, target, final_window) -> (title, lines) of the must-show checks (default: this
    benchmark's issue, ``must_show_checks``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df.to_csv(out / "runs.csv", index=False)
    # one row of panels per group: the main methods, SPEAR against its ablations, multi-answer
    panels = []
    for title, names in (("search_qa: GRPO vs Dr.BoT vs SPEAR", list(MAIN)),
                         ("search_qa: SPEAR ablations (seed 0)", ["SPEAR", *ABLATIONS]),
                         ("multi_answer_search", list(MULTI)),
                         ("text_game: GRPO vs GiGPO vs Dr.BoT(GiGPO)+SPEAR", list(TEXT_GAME))):
        sub = df[df.variant.isin(names)]
        if title.endswith("(seed 0)"):
            if not set(sub.variant) & set(ABLATIONS):
                continue
            sub = sub[sub.seed == 0]
        if len(sub):
            panels.append((title, sub))
    smooth = 5
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 4 * len(panels)), squeeze=False)
    for i, (title, sub) in enumerate(panels):
        metric = "f1" if sub.env.iloc[0] == "multi_answer_search" else "success"
        # every text-game step is a tool call (rate 1): its return shows the invalid actions instead
        second = "reward" if sub.env.iloc[0] == "text_game" else "tool_call_rate"
        for j, m in enumerate((metric, second)):
            ax = axes[i][j]
            for v, g in sub.groupby("variant", sort=False):
                # rolling mean per seed: one iteration's 64 episodes are +-0.05 noise
                piv = g.pivot_table(index="iteration", columns="seed", values=m).rolling(smooth, min_periods=1).mean()
                mean = piv.mean(axis=1)
                ax.plot(mean.index, mean.values, label=v)
                if piv.shape[1] > 1:
                    ax.fill_between(mean.index, piv.min(axis=1), piv.max(axis=1), alpha=0.15)
            ax.set_title(f"{title}: {m}\n(rolling mean of {smooth} iterations; band: min-max over seeds)", fontsize=9)
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

    lines = [f"{args.iterations} iterations of {args.tasks} tasks x {args.group_size} samples, lr {args.lr}; "
             f"final = mean of the last {args.final_window} iterations per seed, then mean +- std over "
             f"seeds; wall time {wall_s / 60:.1f} min on {args.cpus} CPUs.", "",
             f"| variant | task | seeds | final success / F1 | {_reach_header(set(df.env))} | paper (reference) |",
             "|---|---|---|---|---|---|"]
    targets = reach_targets(df, args.final_window)
    target = targets.get("search_qa", float("nan"))
    for v in dict.fromkeys(df.variant):
        sub = df[df.variant == v]
        env = sub.env.iloc[0]
        metric = "f1" if env == "multi_answer_search" else "success"
        mean, std, _ = final_value(df, v, metric, args.final_window)
        reach = (_reach_text(*iterations_to_reach(df, v, metric, targets[env]))
                 if not np.isnan(targets.get(env, float("nan"))) else "-")
        algo = sub.algorithm.iloc[0]
        seeds_v = ",".join(str(x) for x in sorted(set(sub.seed)))
        lines.append(f"| {v} | {env} | {seeds_v} | {mean:.3f} +- {std:.3f} | "
                     f"{reach} | {PAPER_NOTES.get(v, PAPER_NOTES.get(algo, ''))} |")
    lines += ["", "Mean over seeds by blocks of iterations, success (F1 on multi-answer) / tool-call rate:", ""]
    lines += block_table(df)
    multi = multi_answer_table(df, args.final_window)
    if multi:
        lines += ["", "Multi-answer search, final values (the answers found: recall; searches per episode):", ""] + multi
    title, found = (checks or _learning_checks)(df, target, args.final_window)
    if found:
        lines += ["", title, ""] + [f"- {c}" for c in found]
    game = text_game_comparisons(df, args.final_window)
    if game:
        # success alone hides the learning of a policy that never wins: the return counts the
        # invalid actions (-0.1 each), the entropy and length show the policy moving
        lines += ["", "Text game, final values (reward: episode return, +10 on a win, -0.1 per invalid action):", ""]
        lines += final_table(df, "text_game", ("success", "reward", "entropy", "response_length"), args.final_window)
        lines += ["", "Text game (the papers' order on ALFWorld: Dr.BoT(GiGPO)+SPEAR > GiGPO > GRPO):", ""]
        lines += [f"- {c}" for c in game]
    table = "\n".join(lines)
    (out / "table.md").write_text(table + "\n")
    return table


def reach_targets(df, window: int) -> dict[str, float]:
    """Per task of ``REACH_BASELINE`` that ran its baseline: the baseline's final success."""
    out = {}
    for env, (variant, _) in REACH_BASELINE.items():
        sub = df[df.env == env]
        if variant in set(sub.variant):
            out[env] = final_value(sub, variant, "success", window)[0]
    return out


def _reach_header(envs: set[str]) -> str:
    """The "iterations to reach" column's header: the baselines of the tasks in the table."""
    names = [label for env, (_, label) in REACH_BASELINE.items() if env in envs] or ["Dr.BoT"]
    return f"iterations to reach {' / '.join(names)}'s final (seeds that do)"


def gap_line(df, better: str, worse: str, window: int) -> str:
    """"<better> final x vs <worse> y: +z points (order held / not held)" on success."""
    a = final_value(df, better, "success", window)[0]
    b = final_value(df, worse, "success", window)[0]
    gap = 100 * (a - b)
    return f"{better} final {a:.3f} vs {worse} {b:.3f}: {gap:+.1f} points ({'held' if gap > 0 else 'not held'})"


def text_game_comparisons(df, window: int) -> list[str]:
    """The text-game suite's comparisons, in the papers' order (measured, not asserted: the
    embedded game and model are not ALFWorld and Qwen2.5-1.5B); empty without text-game runs."""
    game = df[df.env == "text_game"]
    have = [v for v in TEXT_GAME if v in set(game.variant)]
    if not have:
        return []
    out = [gap_line(game, better, worse, window) for better, worse in
           (("GiGPO-game", "GRPO-game"), ("SPEAR-GiGPO-game", "GiGPO-game"), ("SPEAR-GiGPO-game", "GRPO-game"))
           if better in have and worse in have]
    return out + [seeds_check(game, have, 3)]


def final_table(df, env: str, metrics: tuple[str, ...], window: int) -> list[str]:
    """Markdown rows: the final value (mean +- std over seeds) of each of ``metrics`` for every
    variant run on ``env``; empty without runs there."""
    sub = df[df.env == env]
    if sub.empty:
        return []
    cols = [c for c in metrics if c in sub.columns]
    rows = ["| variant | seeds | " + " | ".join(cols) + " |", "|---" * (len(cols) + 2) + "|"]
    for v in dict.fromkeys(sub.variant):
        seeds_v = ",".join(str(x) for x in sorted(set(sub[sub.variant == v].seed)))
        cells = []
        for c in cols:
            mean, std, _ = final_value(sub, v, c, window)
            cells.append(f"{mean:.3f} +- {std:.3f}")
        rows.append(f"| {v} | {seeds_v} | " + " | ".join(cells) + " |")
    return rows


def multi_answer_table(df, window: int) -> list[str]:
    """Final F1, recall, precision and searches per episode of every multi-answer variant."""
    return final_table(df, "multi_answer_search", ("f1", "recall", "precision", "tool_calls"), window)


def block_table(df, blocks: int = 6) -> list[str]:
    """Markdown rows: per variant, the seed-mean curve averaged over `blocks` blocks of iterations."""
    from rllib_spear.cli import block_means

    rows, header = [], None
    for v in dict.fromkeys(df.variant):
        sub = df[df.variant == v]
        metric = "f1" if sub.env.iloc[0] == "multi_answer_search" else "success"
        curve = sub.groupby("iteration")[[metric, "tool_call_rate"]].mean().sort_index()
        main = block_means(curve[metric].tolist(), blocks)
        tool = block_means(curve["tool_call_rate"].tolist(), blocks)
        if header is None:
            header = [f"{a}-{b}" for a, b, _ in main]
            rows += ["| variant | " + " | ".join(header) + " |", "|---" * (len(header) + 1) + "|"]
        rows.append(f"| {v} | " + " | ".join(f"{m:.3f} / {t:.2f}" for (_, _, m), (_, _, t) in zip(main, tool)) + " |")
    return rows


def _learning_checks(df, target: float, window: int) -> tuple[str, list[str]]:
    return ("Must-show checks (issue: SPEAR >= Dr.BoT + 5 points, reaches Dr.BoT's final in <= 0.6x its "
            "iterations, Dr.BoT >= GRPO; >= 3 seeds):", must_show_checks(df, target, window))


def spear_gap_check(search, window: int, points: float = 5.0) -> str:
    """"SPEAR final x vs Dr.BoT y: +z points (PASS/FAIL)": SPEAR's final success >= Dr.BoT's + ``points``."""
    sp = final_value(search, "SPEAR", "success", window)[0]
    db = final_value(search, "DrBoT", "success", window)[0]
    gap = 100 * (sp - db)
    return f"SPEAR final {sp:.3f} vs Dr.BoT {db:.3f}: {gap:+.1f} points ({'PASS' if gap >= points else 'FAIL'})"


def seeds_check(search, variants: list[str], minimum: int) -> str:
    """"seeds per method: ... (PASS/FAIL)": every one of ``variants`` present ran >= ``minimum`` seeds."""
    n = search[search.variant.isin(variants)].groupby("variant").seed.nunique()
    counts = ", ".join(f"{k} {int(v)}" for k, v in n.items())
    return f"seeds per method: {counts} ({'PASS' if len(n) and n.min() >= minimum else f'FAIL: fewer than {minimum}'})"


def must_show_checks(df, target: float, window: int) -> list[str]:
    """The issue's claims, each with the measured numbers and PASS/FAIL."""
    search = df[df.env == "search_qa"]
    have = set(search.variant)
    out = []
    if {"SPEAR", "DrBoT"} <= have:
        out.append(spear_gap_check(search, window))
        it_sp, r_sp, n_sp = iterations_to_reach(search, "SPEAR", "success", target)
        it_db, r_db, n_db = iterations_to_reach(search, "DrBoT", "success", target)
        ratio = it_sp / it_db if it_db and not np.isnan(it_db) else float("nan")
        # Dr.BoT seeds that never reach count as the run's length (a lower bound on Dr.BoT, an
        # upper bound on the ratio); SPEAR seeds that never reach make the ratio a lower bound.
        verdict = "FAIL" if not ratio <= 0.6 else ("PASS" if r_sp == n_sp else "UNDETERMINED")
        out.append(f"iterations to reach Dr.BoT's final {target:.3f}: SPEAR {_reach_text(it_sp, r_sp, n_sp)}, "
                   f"Dr.BoT {_reach_text(it_db, r_db, n_db)}, ratio {ratio:.2f} ({verdict})")
    if {"DrBoT", "GRPO"} <= have:
        db = final_value(search, "DrBoT", "success", window)[0]
        gr = final_value(search, "GRPO", "success", window)[0]
        out.append(f"Dr.BoT final {db:.3f} vs GRPO {gr:.3f} ({'PASS' if db >= gr else 'FAIL'})")
    if out:
        out.append(seeds_check(search, ["SPEAR", "DrBoT", "GRPO"], 3))
    return out


def run_order(plan: list[tuple], seed_major: bool = False) -> list[tuple]:
    """(name, algorithm, overrides, env, seeds) runs of ``plan`` (entries ending in a seed count):
    every seed of a variant in turn, or with ``seed_major`` one seed of every variant per round."""
    if not seed_major:
        return [(*entry[:-1], list(range(entry[-1]))) for entry in plan]
    rounds = max((entry[-1] for entry in plan), default=0)
    return [(*entry[:-1], [seed]) for seed in range(rounds) for entry in plan if seed < entry[-1]]


def finished_trials(df, iterations: int) -> tuple[list[dict], set[tuple[str, int]]]:
    """The rows of the (variant, seed) trials of a runs.csv that reached ``iterations``, and those
    pairs (``--continue``: a run cut short reruns only what it had not finished)."""
    reached = df.groupby(["variant", "seed"])["iteration"].max()
    done = {(str(v), int(s)) for (v, s), it in reached.items() if it >= iterations}
    keep = df[[(str(v), int(s)) in done for v, s in zip(df.variant, df.seed)]]
    return keep.to_dict("records"), done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 seed, 40 iterations, main variants only (< 10 min)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds of GRPO / Dr.BoT / SPEAR")
    ap.add_argument("--ablation-seeds", type=int, default=1, help="seeds of each SPEAR ablation")
    ap.add_argument("--multi-seeds", type=int, default=1, help="seeds of SPADER and GRPO on multi-answer search")
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--max-turns", type=int, default=None,
                    help=f"turns per episode (default 3; text_game {TEXT_GAME_MAX_TURNS})")
    ap.add_argument("--sil-capacity", type=int, default=8)
    ap.add_argument("--final-window", type=int, default=10, help="iterations averaged for 'final'")
    ap.add_argument("--progress-every", type=int, default=10, help="print a progress line every N iterations")
    ap.add_argument("--seed-major", action="store_true",
                    help="run seed 0 of every variant, then seed 1, ... (a run cut short keeps every variant)")
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--continue", dest="continue_run", action="store_true",
                    help="keep the trials of --out/runs.csv that reached --iterations and run only the others")
    ap.add_argument("--no-ablations", action="store_true")
    ap.add_argument("--no-multi", action="store_true", help="skip SPADER vs GRPO on multi-answer search")
    ap.add_argument("--suite", choices=SUITES, default="main",
                    help="main: the search benchmark; text_game: GRPO vs GiGPO vs Dr.BoT(GiGPO)+SPEAR on the "
                         "embedded text game (--seeds seeds each)")
    ap.add_argument("--variants", default="",
                    help="comma-separated subset of " + ",".join([*MAIN, *ABLATIONS, *MULTI, *TEXT_GAME]))
    ap.add_argument("--model-path", default="embedded", help="cold start of the search_qa runs")
    ap.add_argument("--multi-model-path", default="embedded:multi_answer_search",
                    help="cold start of the multi-answer runs (default: the embedded policy after a "
                         "multi-answer reading stage and demonstrations; the search_qa policy never lists entities)")
    ap.add_argument("--game-layout", choices=("window", "full"), default="window",
                    help="text game: one sample per step with 2 steps of history (the released agent tree, "
                         "default) or one context per episode")
    ap.add_argument("--game-model-path", default="embedded:text_game",
                    help="cold start of the text-game runs (default: the embedded policy after the text game's "
                         "demonstrations; the search_qa policy never writes an <action>)")
    ap.add_argument("--out", default="benchmarks/out/learning_curves")
    ap.add_argument("--replot", action="store_true",
                    help="no training: rewrite the plots and table.md from --out/runs.csv (and meta.json)")
    args = ap.parse_args()
    if args.replot:
        return replot(args)
    if args.quick:
        args.seeds, args.iterations, args.no_ablations, args.no_multi = 1, 40, True, True
    # name -> (algorithm, overrides, env, seeds) of every variant, in the default order
    main_suite = args.suite == "main"
    groups = [(MAIN, "search_qa", args.seeds, main_suite),
              (ABLATIONS, "search_qa", args.ablation_seeds, main_suite and not args.no_ablations),
              (MULTI, "multi_answer_search", args.multi_seeds, main_suite and not args.no_multi),
              (TEXT_GAME, "text_game", args.seeds, args.suite == "text_game")]
    catalog = {n: (a, o, env, seeds) for variants, env, seeds, _ in groups for n, (a, o) in variants.items()}
    if args.variants:
        wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
        unknown = [v for v in wanted if v not in catalog]
        if unknown:
            ap.error(f"--variants: unknown {unknown}; choose from {sorted(catalog)}")
    else:
        wanted = [n for variants, _, _, on in groups if on for n in variants]
    plan = [(n, *catalog[n]) for n in wanted]
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import pandas as pd
    import ray

    import rllib_spear  # noqa: F401  (registers the algorithms)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from rllib_spear.coldstart import resolve_model_path

    # the same cold-start checkpoint for every run of a task (built once here, not per trial)
    envs = {env for *_, env, _ in plan}
    if "search_qa" in envs:
        args.model_path = resolve_model_path(args.model_path)
    if "multi_answer_search" in envs:
        args.multi_model_path = resolve_model_path(args.multi_model_path)
    if "text_game" in envs:
        args.game_model_path = resolve_model_path(args.game_model_path)
    ray.init(num_cpus=args.cpus, include_dashboard=False, ignore_reinit_error=True)
    t0 = time.time()
    rows: list[dict] = []
    done: set[tuple[str, int]] = set()
    if args.continue_run and (out / "runs.csv").exists():  # a run cut short: keep its finished trials
        rows, done = finished_trials(pd.read_csv(out / "runs.csv"), args.iterations)
        print(f"continuing {out}: {len(done)} finished trial(s) kept: {sorted(done)}", flush=True)
    for name, algo, over, env, seeds in run_order(plan, args.seed_major):
        seeds = [s for s in seeds if (name, s) not in done]
        if not seeds:
            continue
        rows += run_variant(name, algo, over, env, seeds, args)
        pd.DataFrame(rows).to_csv(out / "runs.csv", index=False)  # partial results survive a kill
    wall_s = time.time() - t0
    (out / "meta.json").write_text(json.dumps({"wall_s": wall_s, "args": vars(args)}, indent=1))
    table = write_outputs(pd.DataFrame(rows), out, wall_s, args)
    print(table)
    print(f"wrote {out}/runs.csv, curves.png, entropy.png, table.md in {(time.time() - t0) / 60:.1f} min")


def replot(args) -> None:
    """Rewrite the outputs of a finished run from its runs.csv; the run's own settings (meta.json)
    replace the command line's for the table's header."""
    import pandas as pd

    out = Path(args.out)
    meta_path = out / "meta.json"
    wall_s = float("nan")
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        wall_s = float(meta["wall_s"])
        for k in ("iterations", "tasks", "group_size", "lr", "cpus"):
            setattr(args, k, meta["args"][k])
    print(write_outputs(pd.read_csv(out / "runs.csv"), out, wall_s, args))


if __name__ == "__main__":
    main()
