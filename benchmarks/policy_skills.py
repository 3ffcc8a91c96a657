"""What a cold-start policy can do on the embedded search task, before any RL.

Prints, for a model folder (default: the embedded default policy):
- copy: next-token accuracy on the second half of copy sequences (rllib_spear.models.pretrain);
  ~0.86 is the ceiling (span starts are unpredictable), chance is ~0.001;
- forced search: the first turn is started with "<think>I will search for" and the episode is
  sampled to the end at temperature 1: how often the query names the question's entity, and how
  often the episode succeeds (what RL can reach by searching more);
- free rollouts at temperature 1: tool-call rate, success, success with and without a search.

    python benchmarks/policy_skills.py [--model PATH] [--tasks 100]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch


def forced_search(model, tok, tasks, env_factory, prefix: str = "<think>I will search for") -> tuple[float, float]:
    """(query names the entity, success) with the first turn started by ``prefix``."""
    torch.manual_seed(0)
    right_query, success = [], []
    for task in tasks:
        env = env_factory()
        msgs = list(env.reset(task))
        for turn in range(env.max_turns):
            head = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
            lead = prefix if turn == 0 else ""
            ids = tok(head + lead, add_special_tokens=False)["input_ids"]
            out = model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=True, temperature=1.0, top_k=0,
                                 top_p=1.0, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id or 0)
            text = lead + tok.decode(out[0][len(ids):], skip_special_tokens=True)
            if turn == 0:
                right_query.append(f"<search>{task['queries'][0]}</search>" in text)
            msgs.append({"role": "assistant", "content": text})
            res = env.step(text)
            if res.observation is not None:
                msgs.append({"role": "user", "content": res.observation})
            if res.done:
                break
        success.append(bool(env.episode_stats().get("success")))
    return float(np.mean(right_query)), float(np.mean(success))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--group", type=int, default=4, help="free rollouts per task")
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rllib_spear.env_runners.engines.base import SamplingConfig
    from rllib_spear.env_runners.engines.hf_engine import HFEngine
    from rllib_spear.env_runners.rollout import MultiTurnRollout, RolloutConfig
    from rllib_spear.envs import load_tasks, make_env
    from rllib_spear.models.pretrain import copy_accuracy
    from rllib_spear.models.sft import default_policy_path

    path = default_policy_path() if args.model == "embedded" else args.model
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tasks = load_tasks("search_qa", split="train")[: args.tasks]
    factory = lambda: make_env("search_qa", max_turns=3)  # noqa: E731
    t0 = time.time()
    print(f"model: {path}")
    print(f"copy accuracy (second half of copy sequences): {copy_accuracy(model, tok):.3f}")
    q, s = forced_search(model, tok, tasks, factory)
    print(f"forced search on {len(tasks)} train questions: query names the entity {q:.3f}, success {s:.3f}")
    engine = HFEngine(path)
    rollout = MultiTurnRollout(engine, engine.tokenizer, factory, SamplingConfig(max_new_tokens=48, seed=5),
                               RolloutConfig(max_turns=3, max_model_len=768, max_response_tokens=384))
    trajs, _ = rollout.run(tasks, args.group)
    tool = np.array([t.info["tool_calls"] > 0 for t in trajs])
    ok = np.array([bool(t.info["success"]) for t in trajs])
    with_tool = ok[tool].mean() if tool.any() else float("nan")
    without = ok[~tool].mean() if (~tool).any() else float("nan")
    print(f"free rollouts ({len(trajs)}, temperature 1): tool-call rate {tool.mean():.3f}, success {ok.mean():.3f}, "
          f"success with a search {with_tool:.3f} (n={int(tool.sum())}), without {without:.3f}")
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
