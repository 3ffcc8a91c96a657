"""What a cold-start policy can do on the embedded search task, before any RL.

Prints, for a model folder (default: the embedded default policy):
- copy: next-token accuracy on the second half of copy sequences (rllib_spear.models.pretrain);
  ~0.86 is the ceiling (span starts are unpredictable), chance is ~0.001;
- forced search: the first turn is started with "<think>I will search for" and the episode is
  sampled to the end at temperature 1: how often the query names the question's entity, and how
  often the episode succeeds (what RL can reach by searching more);
- free rollouts at temperature 1: tool-call rate, success, success with and without a search.

With ``--task multi_answer_search`` (default model: the embedded multi-answer cold start, on the
env config it was trained with):
- listing: given the scripted demonstration's searches and results, the F1 of the greedy answer
  list (can it copy what it found?), beside the demonstrations' own F1;
- free rollouts at temperature 1: tool-call rate, F1, F1 with and without a search.

With ``--task text_game`` (default model: the embedded text-game cold start, 8 turns):
- next action after the exploring demonstration's own history (greedy, on the test games): how
  often it is the demonstration's action, by phase (looking for the object, taking it, carrying
  it, putting it), and how often it is admissible;
- free rollouts, greedy and at temperature 1: wins and invalid actions per game.

    python benchmarks/policy_skills.py [--task search_qa|multi_answer_search|text_game] [--model PATH] [--tasks 100]
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


def listing_f1_after_searches(engine, tasks, env_config: dict) -> tuple[float, float]:
    """(mean F1 of the greedy answer list given the demonstration's searches and results, mean F1
    of the demonstrations' own answers) on multi-answer ``tasks``."""
    import json
    import re

    from rllib_spear.core.answers import set_precision_recall_f1
    from rllib_spear.env_runners.engines.base import SamplingConfig
    from rllib_spear.envs import scripted_demonstrations

    tok = engine.tokenizer
    demos = scripted_demonstrations("multi_answer_search", tasks, tool_use_rate=1.0, env_config=env_config)
    prompts = [tok(tok.apply_chat_template(c[:-1], add_generation_prompt=True, tokenize=False),
                   add_special_tokens=False)["input_ids"] for c in demos]
    outs = engine.generate(prompts, SamplingConfig(max_new_tokens=64, temperature=1e-4, seed=0))

    def f1_of(text: str, task: dict) -> float:
        m = re.search(r"<answer>(.*?)</answer>", text, re.S)
        try:
            preds = json.loads(m.group(1)) if m else []
        except ValueError:
            preds = []
        preds = [str(p) for p in preds] if isinstance(preds, list) else []
        return set_precision_recall_f1(preds, task["answers"])[2]

    model_f1 = [f1_of(tok.decode(o.token_ids), t) for o, t in zip(outs, tasks)]
    demo_f1 = [f1_of(c[-1]["content"], t) for c, t in zip(demos, tasks)]
    return float(np.mean(model_f1)), float(np.mean(demo_f1))


def free_rollouts(engine, task_name: str, tasks, group: int, env_config: dict, metric: str,
                  max_new_tokens: int = 48, max_model_len: int = 768, max_response_tokens: int = 384,
                  turns: int = 3, temperature: float = 1.0) -> dict:
    """Tool-call rate and ``metric`` (overall, with and without a search) of ``group`` episodes
    per task sampled at ``temperature`` (``turns`` turns), and the episodes themselves."""
    from rllib_spear.env_runners.engines.base import SamplingConfig
    from rllib_spear.env_runners.rollout import MultiTurnRollout, RolloutConfig
    from rllib_spear.envs import make_env

    factory = lambda: make_env(task_name, **{**env_config, "max_turns": turns})  # noqa: E731
    sampling = SamplingConfig(max_new_tokens=max_new_tokens, seed=5, temperature=temperature)
    rollout = MultiTurnRollout(engine, engine.tokenizer, factory, sampling,
                               RolloutConfig(max_turns=turns, max_model_len=max_model_len,
                                             max_response_tokens=max_response_tokens))
    trajs, _ = rollout.run(tasks, group)
    tool = np.array([t.stats.tool_calls > 0 for t in trajs])
    value = np.array([float(t.stats[metric]) for t in trajs])
    return {"episodes": len(trajs), "tool_call_rate": float(tool.mean()), metric: float(value.mean()),
            "with_search": float(value[tool].mean()) if tool.any() else float("nan"), "searching": int(tool.sum()),
            "without_search": float(value[~tool].mean()) if (~tool).any() else float("nan"), "trajectories": trajs}


def multi_answer_main(args) -> None:
    from rllib_spear.env_runners.engines.hf_engine import HFEngine
    from rllib_spear.envs import load_tasks
    from rllib_spear.coldstart import task_policy_env_config, task_policy_path

    path = task_policy_path("multi_answer_search") if args.model == "embedded" else args.model
    env_config = task_policy_env_config("multi_answer_search")
    engine = HFEngine(path)
    t0 = time.time()
    print(f"model: {path}\nenv_config: {env_config}")
    test = load_tasks("multi_answer_search", split="test")[: args.tasks]
    model_f1, demo_f1 = listing_f1_after_searches(engine, test, env_config)
    print(f"listing after the demonstrations' searches ({len(test)} test questions, greedy): F1 {model_f1:.3f} "
          f"(the demonstrations' own answers: {demo_f1:.3f})")
    r = free_rollouts(engine, "multi_answer_search", load_tasks("multi_answer_search", split="train")[: args.tasks],
                      args.group, env_config, "f1", max_new_tokens=64, max_model_len=1024, max_response_tokens=512)
    print(f"free rollouts ({r['episodes']}, temperature 1): tool-call rate {r['tool_call_rate']:.3f}, F1 {r['f1']:.3f}, "
          f"F1 with a search {r['with_search']:.3f} (n={r['searching']}), without {r['without_search']:.3f}")
    print(f"({time.time() - t0:.0f} s)")


def next_action_after_demonstration(engine, tasks, env_config: dict) -> dict[str, tuple[float, int]]:
    """Per phase of the exploring demonstrations of ``tasks`` (named by the turn's thought, "look",
    "take", "carry", "put", and "all") and per turn ("turn 1", "turn 2", "turn 3", "turn 4+"):
    (fraction of turns where the greedy next turn, given the demonstration's history, holds the
    demonstration's action, turns); "admissible": (fraction whose action was admissible there,
    turns)."""
    import re

    from rllib_spear.env_runners.engines.base import SamplingConfig
    from rllib_spear.envs import scripted_demonstrations

    tok = engine.tokenizer
    demos = scripted_demonstrations("text_game", tasks, tool_use_rate=1.0, env_config=env_config,
                                    game_player="explorer")
    prompts, wanted, phases, admissible, turn_of = [], [], [], [], []
    for conv in demos:
        turn = 0
        for k, m in enumerate(conv):
            if m["role"] != "assistant":
                continue
            turn += 1
            turn_of.append(f"turn {turn}" if turn < 4 else "turn 4+")
            prompts.append(tok(tok.apply_chat_template(conv[:k], add_generation_prompt=True, tokenize=False),
                               add_special_tokens=False)["input_ids"])
            wanted.append(re.search(r"<action>(.*)</action>", m["content"]).group(1))
            thought = re.search(r"<think>(.*)</think>", m["content"]).group(1)
            phases.append(next(p for p, w in (("look", "look for"), ("take", "is here"), ("carry", "carry"),
                                              ("put", "put the")) if w in thought))
            shown = re.search(r"Admissible actions: (.*?)(</observation>)?$", conv[k - 1]["content"], re.S)
            admissible.append(shown.group(1).split(", ") if shown else [])
    outs = engine.generate(prompts, SamplingConfig(max_new_tokens=64, temperature=1e-4, seed=0))
    got = [re.search(r"<action>(.*?)</action>", tok.decode(o.token_ids, skip_special_tokens=True)) for o in outs]
    got = [g.group(1).strip() if g else None for g in got]
    right = np.array([g == w for g, w in zip(got, wanted)])
    phases = np.array(phases)
    out = {p: (float(right[phases == p].mean()), int((phases == p).sum()))
           for p in ("look", "take", "carry", "put") if (phases == p).any()}
    out["all"] = (float(right.mean()), len(right))
    turn_of = np.array(turn_of)
    out.update({t: (float(right[turn_of == t].mean()), int((turn_of == t).sum()))
                for t in ("turn 1", "turn 2", "turn 3", "turn 4+") if (turn_of == t).any()})
    out["admissible"] = (float(np.mean([g in a for g, a in zip(got, admissible)])), len(got))
    return out


def text_game_main(args) -> None:
    from rllib_spear.env_runners.engines.hf_engine import HFEngine
    from rllib_spear.envs import load_tasks
    from rllib_spear.coldstart import task_policy_env_config, task_policy_path

    path = task_policy_path("text_game") if args.model == "embedded" else args.model
    env_config = {**task_policy_env_config("text_game"), "max_turns": 8}
    engine = HFEngine(path)
    t0 = time.time()
    print(f"model: {path}\nenv_config: {env_config}")
    test = load_tasks("text_game", split="test")[: args.tasks]
    acc = next_action_after_demonstration(engine, test, env_config)
    print(f"next action after the exploring demonstration's history ({len(test)} test games, greedy): "
          + ", ".join(f"{p} {v:.3f} (n={n})" for p, (v, n) in acc.items()))
    train = load_tasks("text_game", split="train")[: args.tasks]
    for temperature, group in ((0.0, 1), (1.0, args.group)):
        r = free_rollouts(engine, "text_game", train, group, env_config, "success", max_new_tokens=64,
                          max_model_len=2048, max_response_tokens=1792, turns=8, temperature=temperature)
        invalid = np.mean([t.stats["invalid_actions"] for t in r["trajectories"]])
        print(f"free rollouts ({r['episodes']} train games, temperature {temperature:g}): wins {r['success']:.3f}, "
              f"invalid actions per game {invalid:.2f} of 8")
    print(f"({time.time() - t0:.0f} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="search_qa", choices=["search_qa", "multi_answer_search", "text_game"])
    ap.add_argument("--model", default="embedded", help="model folder (default: the task's embedded cold start)")
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--group", type=int, default=4, help="free rollouts per task")
    args = ap.parse_args()
    if args.task == "multi_answer_search":
        return multi_answer_main(args)
    if args.task == "text_game":
        return text_game_main(args)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rllib_spear.env_runners.engines.hf_engine import HFEngine
    from rllib_spear.envs import load_tasks, make_env
    from rllib_spear.models.pretrain import copy_accuracy
    from rllib_spear.coldstart import default_policy_path

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
    r = free_rollouts(HFEngine(path), "search_qa", tasks, args.group, {}, "success")
    print(f"free rollouts ({r['episodes']}, temperature 1): tool-call rate {r['tool_call_rate']:.3f}, "
          f"success {r['success']:.3f}, success with a search {r['with_search']:.3f} (n={r['searching']}), "
          f"without {r['without_search']:.3f}")
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
