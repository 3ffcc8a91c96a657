"""Build the SmolLM2-135M-Instruct tool-use cold start and measure how often it calls new tools.

Builds (or finds in the cache) ``model_path: "smollm2-tools"`` (``rllib_spear.coldstart.smollm2_tools``),
prints the build time, then samples episodes at temperature 1 (the RL sampling: 64 new tokens a
turn) on environments the cold start never saw, for the cold start and for the plain instruct
model (``"smollm2-instruct"``):

- held-out synthetic tools: ``--episodes`` episodes of ``synthetic_tool_episodes(split="heldout")``
  (tool names, descriptions, parameter names and requests of the catalogues' held-out part), each
  on its own ``FunctionToolEnv``, 3 turns;
- a calculator: ``CalculatorEnv`` (``add`` / ``multiply`` / ``subtract``, two-number requests,
  exact-match reward), ``--episodes`` episodes, 3 turns;
- the README's city-facts environment (``lookup_city``), 2 turns as in the README.

For each: the tool-call rate (episodes with at least one well-formed call of an existing tool),
the answer rate (a final ``<answer>``) and success (reward 1).

    python benchmarks/smollm2_tools_coldstart.py [--episodes 48] [--skip-instruct]
"""
from __future__ import annotations

import argparse
import random
import time
from typing import Any

import numpy as np

from rllib_spear.envs.base import ToolEnv
from rllib_spear.envs.function_tools import FunctionToolEnv


def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def multiply(a: float, b: float) -> float:
    """Multiply two numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a * b


def subtract(a: float, b: float) -> float:
    """Subtract b from a.

    Args:
        a: the number to subtract from
        b: the number to subtract
    """
    return a - b


def number_reward(task: dict, answer: str) -> float:
    """1.0 when the answer is the task's number (``"391"``, ``"391.0"`` and ``"391"`` agree)."""
    try:
        return float(abs(float(answer.replace(",", "").strip()) - float(task["answer"])) < 1e-6)
    except (TypeError, ValueError):
        return 0.0


class CalculatorEnv(FunctionToolEnv):
    """A first environment of one's own: three arithmetic tools, two-number requests."""

    def __init__(self, max_turns: int = 3, **kw: Any):
        super().__init__(tools=[add, multiply, subtract], reward_fn=number_reward, max_turns=max_turns, **kw)


def calculator_tasks(n: int, seed: int = 0) -> list[dict]:
    """``n`` two-number requests (plus, times, minus) with their answers."""
    rng = random.Random(seed)
    asks = [("What is {a} plus {b}?", lambda a, b: a + b), ("What is {a} times {b}?", lambda a, b: a * b),
            ("What is {a} minus {b}?", lambda a, b: a - b)]
    out = []
    for i in range(n):
        text, fn = asks[i % len(asks)]
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        out.append({"question": text.format(a=a, b=b), "answer": str(fn(a, b))})
    return out


CITIES = {"Veloria": {"country": "Arden", "river": "Sel"}, "Marrow": {"country": "Tessaly", "river": "Vane"}}


def lookup_city(city: str) -> dict:
    """Facts about a city.

    Args:
        city: the city's name
    """
    return CITIES[city]


class CityFactsEnv(FunctionToolEnv):
    """The README's environment."""

    def __init__(self, max_turns: int = 3, **kw: Any):
        super().__init__(tools=[lookup_city], max_turns=max_turns, **kw)


class HeldOutToolsEnv(ToolEnv):
    """Each task's own generated tools: the ``FunctionToolEnv`` its synthetic episode was played on."""

    def __init__(self, episodes: dict[str, Any], max_turns: int = 3):
        self.episodes, self.max_turns, self.env = episodes, max_turns, None

    def reset(self, task: dict) -> list[dict]:
        self.env = self.episodes[task["uid"]].make_env(self.max_turns)
        return self.env.reset(task)

    def step(self, text: str):
        return self.env.step(text)

    def episode_stats(self):
        return self.env.episode_stats()


def measure(path: str, make_env, tasks: list[dict], max_turns: int, group: int = 1, seed: int = 5) -> dict:
    """Tool-call rate, answer rate and success of ``group`` episodes per task at temperature 1."""
    from rllib_spear.env_runners.engines.base import SamplingConfig
    from rllib_spear.env_runners.engines.hf_engine import HFEngine
    from rllib_spear.env_runners.rollout import MultiTurnRollout, RolloutConfig

    engine = HFEngine(path)
    rollout = MultiTurnRollout(engine, engine.tokenizer, make_env, SamplingConfig(max_new_tokens=64, seed=seed),
                               RolloutConfig(max_turns=max_turns, max_model_len=2048, max_response_tokens=512))
    trajs, _ = rollout.run(tasks, group)
    calls = np.array([t.stats.tool_calls > 0 for t in trajs])
    answered = np.array([bool(t.stats.has_answer) for t in trajs])
    win = np.array([bool(t.stats.success) for t in trajs])
    return {"episodes": len(trajs), "tool_call_rate": float(calls.mean()), "answer_rate": float(answered.mean()),
            "success": float(win.mean()), "example": trajs[0].rollout.assistant_texts}


def suites(episodes: int) -> dict[str, tuple]:
    """name -> (env factory, tasks, max_turns)."""
    from rllib_spear.coldstart.tool_episodes import synthetic_tool_episodes

    held = synthetic_tool_episodes(episodes, seed=1, split="heldout")
    by_uid = {f"heldout-{i}": ep for i, ep in enumerate(held)}
    held_tasks = [{**ep.task, "uid": uid} for uid, ep in by_uid.items()]
    city_tasks = [{"question": f"Which {field} is {name} in?" if field == "country" else
                   f"Which river flows through {name}?", "answer": facts[field]}
                  for name, facts in CITIES.items() for field in ("country", "river")]
    return {
        "held-out synthetic tools": (lambda: HeldOutToolsEnv(by_uid, 3), held_tasks, 3),
        "calculator": (lambda: CalculatorEnv(max_turns=3), calculator_tasks(episodes), 3),
        "README city facts": (lambda: CityFactsEnv(max_turns=2), city_tasks * max(1, episodes // 16), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=48, help="episodes per environment")
    ap.add_argument("--skip-instruct", action="store_true", help="measure the cold start only")
    ap.add_argument("--model", default=None, help="a model folder to measure instead of the cold start")
    args = ap.parse_args()
    from rllib_spear.coldstart.smollm2 import smollm2_instruct_path
    from rllib_spear.coldstart.smollm2_tools import smollm2_tools_path

    t0 = time.time()
    models = {"smollm2-tools": args.model or smollm2_tools_path()}
    if args.model is None:
        print(f"cold start: {models['smollm2-tools']} ({time.time() - t0:.0f} s to build or find)", flush=True)
    if not args.skip_instruct:
        models = {"smollm2-instruct": smollm2_instruct_path(), **models}
    for label, (make_env, tasks, turns) in suites(args.episodes).items():
        for name, path in models.items():
            t0 = time.time()
            r = measure(path, make_env, tasks, turns)
            print(f"{label:26s} {name:17s} {r['episodes']:3d} episodes: tool-call rate {r['tool_call_rate']:.3f}, "
                  f"answer rate {r['answer_rate']:.3f}, success {r['success']:.3f} [{time.time() - t0:.0f} s]",
                  flush=True)
            print(f"  example turns: {r['example']!r:.300}", flush=True)


if __name__ == "__main__":
    main()
