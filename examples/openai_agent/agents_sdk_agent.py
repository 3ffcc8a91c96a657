"""The same calculator agent written with the OpenAI Agents SDK (``pip install openai-agents``; the
``test`` extra installs it and tests/examples/test_openai_agent_examples.py trains it in CI),
trained unchanged through the env runner's OpenAI endpoint.

Run it (CPU; the tiny embedded model with ``--model tiny``)::

    pip install openai-agents
    python examples/openai_agent/agents_sdk_agent.py --model tiny --iterations 2

The SDK's ``Agent`` runs its own loop (model call, tool calls, model call, ...) through
``OpenAIChatCompletionsModel`` over the ``AsyncOpenAI`` client the env runner hands the program
(an ``async def`` program gets one): every call it makes lands on the episode's URL and is
captured. Tracing is off (it would send traces to OpenAI's servers).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from calculator_agent import MODEL, SYSTEM, calculator, tasks  # noqa: E402


async def solve(task: dict[str, Any], client: Any) -> float:
    """One episode with the Agents SDK: reward 1 when the final output holds the right number."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from agents.exceptions import MaxTurnsExceeded

    set_tracing_disabled(True)
    agent = Agent(name="calculator", instructions=SYSTEM, tools=[function_tool(calculator)],
                  model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
                  model_settings=ModelSettings(max_tokens=64))
    try:
        result = await Runner.run(agent, task["question"], max_turns=3)
    except MaxTurnsExceeded:  # the agent never answered: no reward (its calls are still trained on)
        return 0.0
    return 1.0 if task["answer"] in str(result.final_output) else 0.0


def config(model: str, *, num_env_runners: int = 1) -> Any:
    from rllib_spear import GRPOConfig

    return (GRPOConfig()
            .environment("agent_program", env_config={"program": solve, "episode_timeout_s": 600},
                         dataset=tasks())
            .env_runners(num_env_runners=num_env_runners, rollout_mode="agent_program", max_new_tokens=64,
                         max_model_len=2048, max_response_tokens=1024)
            .training(group_size=4, tasks_per_iteration=2, lr=1e-5, response_filters=(),
                      group_filter_keep_fraction=None)
            .rl_module(model_config={"model_path": model})
            .debugging(seed=0))


def train(model: str, iterations: int = 2, **kwargs: Any) -> list[dict]:
    algo = config(model, **kwargs).build_algo()
    results = []
    try:
        for _ in range(iterations):
            r = algo.train()
            m = r["env_runners"]
            print(f"iteration {r['training_iteration']}: reward {m['reward_total_mean']:.3f}, "
                  f"model calls/episode {m['turns_mean']:.2f}, program errors {m['agent_program_errors']:.0f}",
                  flush=True)
            results.append(r)
    finally:
        algo.stop()
    return results


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-tools", help="smollm2-tools | smollm2-instruct | tiny | a model folder")
    ap.add_argument("--iterations", type=int, default=2)
    args = ap.parse_args()
    model = args.model
    if model == "tiny":
        from rllib_spear.models.factory import tiny_model_path

        model = tiny_model_path()
    train(model, args.iterations)
