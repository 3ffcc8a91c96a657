import pytest

from rllib_spear.envs import load_tasks, make_env
from rllib_spear.envs.code_math import math_answers_match


@pytest.fixture(scope="module")
def task():
    return load_tasks("code_math")[0]


def test_answer_matching():
    assert math_answers_match("1,234", "1234") and math_answers_match(r"\frac{1}{2}", "0.5")
    assert math_answers_match(r"\text{42}", "42") and math_answers_match("$-7$", "-7")
    assert not math_answers_match("41", "42") and not math_answers_match(None, "1")


def test_correct_episode(task):
    env = make_env("code_math")
    msgs = env.reset(task)
    assert "<code>" in msgs[0]["content"] and msgs[1]["content"] == task["prompt"]
    r = env.step(f"<think>compute</think>\n<code>\n```python\nprint({task['expression']})\n```\n</code>")
    assert r.observation == f"<interpreter>{task['answer']}\n</interpreter>" and not r.done and r.reward == 0
    r = env.step(f"<think>ok</think> The answer is \\boxed{{{task['answer']}}}.")
    assert r.done and r.reward == 1.0 and r.observation is None
    s = env.episode_stats()
    assert s["correct"] and s["success"] and s["tool_calls"] == 1 and s["queries_per_step"] == [1, 0]
    assert s["format_ok"] and s["has_answer"] and s["outcome_reward"] == 1.0


def test_wrong_malformed_and_errors(task):
    env = make_env("code_math", max_turns=4)
    env.reset(task)
    r = env.step("<code>```python\nprint(1/0)\n```</code>")
    assert "ZeroDivisionError" in r.observation and r.observation.startswith("<interpreter>")
    r = env.step("```python\nx = 1\n")
    assert r.observation == "<interpreter>Error: unclosed ```python fence</interpreter>"
    r = env.step("<code>```python\nx = 5\n```</code>")
    assert "no output" in r.observation
    r = env.step("The answer is 12.")  # 4th turn, no box
    assert r.done and r.reward == -1.0
    s = env.episode_stats()
    assert not s["has_answer"] and not s["format_ok"] and s["tool_calls"] == 2 and s["exec_errors"] == 1
    env.reset(task)
    assert env.step("\\boxed{0}").reward == -1.0


def test_stateful_only_when_asked(task):
    env = make_env("code_math")
    env.reset(dict(task, stateful=True))
    env.step("<code>```python\nx = 20\nprint('set')\n```</code>")
    r = env.step("<code>```python\nprint(x + 1)\n```</code>")
    assert r.observation == "<interpreter>21\n</interpreter>"
    env.reset(task)  # not stateful
    env.step("<code>```python\nx = 20\n```</code>")
    assert "NameError" in env.step("<code>```python\nprint(x)\n```</code>").observation


def test_hermes_format(task):
    env = make_env("code_math", parser="hermes")
    env.reset(task)
    code = f"print({task['expression']})"
    r = env.step('<tool_call>{"name": "code_interpreter", "arguments": {"code": "%s"}}</tool_call>' % code)
    assert r.observation == f"<tool_response>{task['answer']}\n</tool_response>"
    assert env.step(f"\\boxed{{{task['answer']}}}").reward == 1.0
