"""FunctionToolEnv: plain Python functions as Hermes tools (schemas in the prompt, calls, failures
as observations, caps, answer scoring)."""
from __future__ import annotations

import json

import pytest

from rllib_spear.core.episode import EpisodeStats
from rllib_spear.envs import FunctionToolEnv
from rllib_spear.envs.function_tools import TOOLS_PROMPT, function_schema


# ----------------------------------------------------------------------------- FunctionToolEnv
def lookup(city: str, field: str = "river") -> str:
    """Look a fact up.

    Args:
        city: the city
        field: which fact
    """
    return {"veloria": {"river": "Sel"}}[city.lower()][field]


def boom() -> str:
    """Always fails.
    """
    raise RuntimeError("the tool broke")


def big(n: int) -> str:
    """A long result.

    Args:
        n: how many characters
    """
    return "x" * n


def no_docs(a, b: int = 2):
    return {"sum": a + b}


def call(name, **args):
    return f'<tool_call>{json.dumps({"name": name, "arguments": args})}</tool_call>'


@pytest.fixture
def fenv():
    env = FunctionToolEnv(tools=[lookup, boom, big, no_docs], max_turns=3, max_calls_per_turn=2,
                          max_observation_chars=100)
    env.reset({"question": "Which river flows through Veloria?", "answer": "Sel"})
    return env


def test_schemas_in_the_system_prompt(fenv):
    prompt = fenv.system_prompt
    block = prompt.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    schemas = [json.loads(line) for line in block.splitlines()]
    assert [s["function"]["name"] for s in schemas] == ["lookup", "boom", "big", "no_docs"]
    lk = schemas[0]["function"]
    assert lk["description"] == "Look a fact up."
    assert lk["parameters"]["properties"]["city"] == {"type": "string", "description": "the city"}
    assert lk["parameters"]["required"] == ["city"]
    # no docstring and a missing hint: a schema from the signature
    nd = schemas[3]["function"]["parameters"]
    assert nd["properties"] == {"a": {}, "b": {"type": "integer"}} and nd["required"] == ["a"]
    assert "<tool_call>" in prompt and "<answer>" in prompt
    assert function_schema(lookup, "renamed")["function"]["name"] == "renamed"


def test_custom_system_prompts():
    env = FunctionToolEnv(tools=[lookup], system_prompt="Tools:\n{tools}\nGo.")
    assert env.system_prompt.startswith("Tools:\n{\"type\": \"function\"") and env.system_prompt.endswith("Go.")
    env = FunctionToolEnv(tools=[lookup], system_prompt="You are a geographer.")
    assert env.system_prompt.startswith("You are a geographer.\n\n# Tools") and '"lookup"' in env.system_prompt
    assert TOOLS_PROMPT.count("{tools}") == 1


def test_a_call_runs_and_the_answer_is_scored(fenv):
    r = fenv.step("<think>look it up</think>" + call("lookup", city="Veloria"))
    assert not r.done and r.observation == "<tool_response>\nSel\n</tool_response>"
    r = fenv.step("<answer>the Sel</answer>")
    assert r.done and r.reward == 1.0 and r.observation is None
    s = fenv.episode_stats()
    assert EpisodeStats.coerce(s, "FunctionToolEnv") is s
    assert (s.success, s.tool_calls, s.queries_per_step, s.format_ok, s.has_answer, s.em) == \
        (True, 1, [1, 0], True, True, 1.0)
    assert s.extra["answer"] == "the Sel" and s.extra["tool_errors"] == 0 and s.extra["calls_by_tool"] == {"lookup": 1}
    assert fenv.step("more").done  # the episode is over


def test_tool_failures_are_observations(fenv):
    text = (call("boom") + call("lookup", city="Nowhere"))
    r = fenv.step(text)
    assert not r.done
    assert "Error: boom raised RuntimeError: the tool broke" in r.observation
    assert "Error: lookup raised KeyError: 'nowhere'" in r.observation
    assert r.observation.count("<tool_response>") == 2
    r = fenv.step('<tool_call>{"name": "lookup", "arguments": {"town": "x"}}</tool_call>'
                  '<tool_call>{not json}</tool_call>')
    assert "bad arguments for 'lookup'" in r.observation and "not valid JSON" in r.observation
    s = fenv.episode_stats()
    assert s.tool_calls == 2 and s.extra["tool_errors"] == 4 and not s.format_ok


def test_unknown_tool_string_arguments_and_unclosed_tags(fenv):
    r = fenv.step(call("nope"))
    assert "unknown tool 'nope'; available: ['big', 'boom', 'lookup', 'no_docs']" in r.observation
    r = fenv.step('<tool_call>{"name": "no_docs", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert r.observation == '<tool_response>\n{"sum": 3}\n</tool_response>'  # non-str results are JSON
    env = FunctionToolEnv(tools=[lookup])
    env.reset({"question": "q", "answer": "a"})
    r = env.step("<tool_call>{")
    assert not r.done and "unclosed <tool_call>" in r.observation


def test_calls_per_turn_and_observation_length_are_capped(fenv):
    r = fenv.step(call("big", n=10_000) * 3)
    parts = r.observation.split("</tool_response>")
    assert r.observation.count("<tool_response>") == 2  # max_calls_per_turn=2
    assert all(len(p) < 140 for p in parts) and "truncated" in r.observation
    assert "only the first 2 of 3 tool calls were run" in r.observation
    assert fenv.episode_stats().queries_per_step == [3]


def test_max_turns_and_missing_answer(fenv):
    fenv.step(call("lookup", city="Veloria"))
    fenv.step(call("lookup", city="Veloria"))
    r = fenv.step(call("lookup", city="Veloria"))  # the third turn is the last: not run
    assert r.done and r.reward == 0.0
    s = fenv.episode_stats()
    assert (s.has_answer, s.success, s.tool_calls, s.extra["truncated"]) == (False, False, 2, True)
    fenv.reset({"question": "q", "answer": "Sel"})
    r = fenv.step("I do not know")
    assert r.done and r.reward == 0.0 and not fenv.episode_stats().has_answer


def test_answer_scoring_defaults_and_custom_reward():
    env = FunctionToolEnv(tools=[lookup])
    env.reset({"question": "q", "golden_answers": ["Sel", "River Sel"]})
    assert env.step("<answer>river sel</answer>").reward == 1.0
    env.reset({"prompt": "q", "answer": ["x", "y"]})
    assert env.step("<answer>Y</answer>").reward == 1.0
    env = FunctionToolEnv(tools=[lookup], reward_fn=lambda task, answer: 0.5 * (answer == task["answer"]),
                          success_threshold=0.5)
    env.reset({"question": "q", "answer": "Sel"})
    assert env.step("<answer>Sel</answer>").reward == 0.5
    s = env.episode_stats()
    assert s.success and s.em is None and s.outcome_reward == 0.5
    with pytest.raises(KeyError, match="no string 'question' or 'prompt'"):
        env.reset({"text": "q"})


def test_function_tool_env_arguments_are_checked():
    with pytest.raises(ValueError, match="at least one tool"):
        FunctionToolEnv(tools=[])
    with pytest.raises(ValueError, match="two tools named 'lookup'"):
        FunctionToolEnv(tools=[lookup, lookup])
    with pytest.raises(TypeError, match="not callable"):
        FunctionToolEnv(tools=["lookup"])
