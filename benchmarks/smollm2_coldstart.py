"""Build the SmolLM2-135M-Instruct search cold start and measure what it does before any RL.

Builds (or finds in the cache) ``model_path: "smollm2-search"`` (``rllib_spear.coldstart.smollm2``)
and prints the build time, then samples ``--group`` episodes per test question of the embedded
search task at temperature 1 (the RL sampling; 3 turns, 64 new tokens a turn) and prints:

- format-ok rate: episodes whose every turn parsed (a well-formed ``<search>`` or ``<answer>``);
- tool-call rate: episodes with at least one search (the embedded cold start: ~0.2-0.4);
- success: exact match of the final answer, overall, with and without a search.

    python benchmarks/smollm2_coldstart.py [--tasks 32] [--group 2] [--model PATH]

``--model PATH`` measures another folder instead (e.g. the untuned SmolLM2: the folder that
``rllib_spear.models.smollm.smollm2_path()`` returns).
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def measure(path: str, tasks: list[dict], group: int, max_new_tokens: int = 64) -> dict:
    """Format-ok rate, tool-call rate and success of ``group`` free episodes per task."""
    from rllib_spear.env_runners.engines.base import SamplingConfig
    from rllib_spear.env_runners.engines.hf_engine import HFEngine
    from rllib_spear.env_runners.rollout import MultiTurnRollout, RolloutConfig
    from rllib_spear.envs import make_env

    engine = HFEngine(path)
    rollout = MultiTurnRollout(engine, engine.tokenizer, lambda: make_env("search_qa", max_turns=3),
                               SamplingConfig(max_new_tokens=max_new_tokens, seed=5),
                               RolloutConfig(max_turns=3, max_model_len=1024, max_response_tokens=512))
    trajs, _ = rollout.run(tasks, group)
    tool = np.array([t.stats.tool_calls > 0 for t in trajs])
    ok = np.array([bool(t.stats.format_ok) for t in trajs])
    win = np.array([bool(t.stats.success) for t in trajs], float)
    return {"episodes": len(trajs), "format_ok": float(ok.mean()), "tool_call_rate": float(tool.mean()),
            "success": float(win.mean()), "searching": int(tool.sum()),
            "success_with_search": float(win[tool].mean()) if tool.any() else float("nan"),
            "success_without_search": float(win[~tool].mean()) if (~tool).any() else float("nan"),
            "example": trajs[0].rollout.assistant_texts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=32, help="test questions")
    ap.add_argument("--group", type=int, default=2, help="episodes per question")
    ap.add_argument("--model", default=None, help="a model folder to measure instead of the cold start")
    args = ap.parse_args()
    from rllib_spear.coldstart.smollm2 import smollm2_search_path
    from rllib_spear.envs import load_tasks

    t0 = time.time()
    path = args.model or smollm2_search_path()
    if args.model is None:
        print(f"cold start: {path} ({time.time() - t0:.0f} s to build or find)")
    tasks = load_tasks("search_qa", split="test")[: args.tasks]
    t0 = time.time()
    r = measure(path, tasks, args.group)
    print(f"{r['episodes']} episodes ({len(tasks)} test questions x {args.group}, temperature 1): "
          f"format-ok {r['format_ok']:.3f}, tool-call rate {r['tool_call_rate']:.3f}, success {r['success']:.3f} "
          f"(with a search {r['success_with_search']:.3f}, n={r['searching']}; "
          f"without {r['success_without_search']:.3f}) [{time.time() - t0:.0f} s]")
    print("example turns:", r["example"])


if __name__ == "__main__":
    main()
