"""The ``retool`` code-tool format (rllib_spear/envs/retool_format.py, docs/tools.md): the released
SPEAR ReTool SandboxFusion tool's limits, prelude, result text, truncation, prompt, call rule and
answer check, each against a hand-written expected value."""
from __future__ import annotations

import json

import pytest

from rllib_spear.envs import make_env
from rllib_spear.envs.code_formats import get_tool_format, tool_format_names
from rllib_spear.envs.parsers import ParsedTurn
from rllib_spear.envs.retool_format import (
    ANSWER_FORMAT,
    TOOL_SCHEMA,
    WRAPPER_CODE,
    ReToolCallParser,
    extract_code,
    result_text,
    strict_box_answer,
    truncate_middle,
)
from rllib_spear.envs.sandbox import SandboxResult
from rllib_spear.testing import check_env_contract, check_parser_contract

TASK = {"prompt": "What is 2+2?", "answer": "4"}
SUFFIX = "\nThe answer format must be: \\boxed{'The final answer goes here.'}"


def call(code: str) -> str:
    return '<think>run it</think>\n<tool_call>' + json.dumps(
        {"name": "code_interpreter", "arguments": {"code": code}}) + "</tool_call>"


@pytest.fixture(scope="module")
def env():
    # 2 s instead of the released 30 s keeps the timeout test cheap (the 30 s default is asserted
    # on the config in test_contract_values)
    return make_env("code_math", tool_format="retool", sandbox_config={"wall_timeout_s": 2.0, "cpu_time_s": 2})


def observe(env, code: str) -> str:
    env.reset(TASK)
    r = env.step(call(code))
    assert not r.done and r.reward == 0.0
    return r.observation


def test_contract_values():
    e = make_env("code_math", tool_format="retool")
    cfg = e._sandbox_config
    assert (cfg.wall_timeout_s, cfg.cpu_time_s, cfg.memory_mb) == (30.0, 30, 1024)
    assert cfg.preamble == "" and cfg.separate_stderr and cfg.script_tracebacks
    assert e.max_obs_chars == 16384 and e.parser.max_calls == 1 and e.system_prompt is None
    assert e.tool_schemas == [{"type": "function", "function": {
        "name": "code_interpreter", "description": "A tool for executing code.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "The code to execute."}},
                       "required": ["code"]}}}]
    assert ANSWER_FORMAT == SUFFIX and TOOL_SCHEMA == e.tool_schemas[0]
    assert WRAPPER_CODE.startswith("\nimport traceback\nfrom string import *\n")
    assert WRAPPER_CODE.endswith("import json\nimport numpy as np\n\n")
    assert WRAPPER_CODE.count("\n") == 38  # 36 import lines, a leading and a trailing blank line
    assert {"default", "retool"} <= set(tool_format_names())
    # the default mode is today's
    d = make_env("code_math")
    assert (d._sandbox_config.wall_timeout_s, d._sandbox_config.cpu_time_s) == (10.0, 5)
    assert d.max_obs_chars == 1000 and d.tool_schemas is None and d.system_prompt.startswith("Solve the problem.")


def test_print_output_and_stdlib_star_import(env):
    assert observe(env, "print(gcd(4, 6))") == "2"  # from math import *
    assert observe(env, "print(Counter('abca')['a'], comb(5, 2))") == "2 10"  # collections, math
    assert observe(env, "```python\nprint(6 * 7)\n```") == "42"  # the fence is stripped


def test_numpy_available(env):
    assert observe(env, "print(np.arange(3).sum())") == "3"


def test_numpy_imports_under_a_tight_process_limit():
    # OpenBLAS starts a thread per core unless told otherwise and threads count against
    # RLIMIT_NPROC: without the launcher's one-thread setting `import numpy` fails as soon as the
    # machine has more cores than max_processes (the released prelude imports numpy every call)
    e = make_env("code_math", tool_format="retool", sandbox_config={"max_processes": 1})
    assert observe(e, "import os\nprint(np.ones(2).sum(), os.environ['OPENBLAS_NUM_THREADS'])") == "2.0 1"


def test_no_print(env):
    assert observe(env, "x = 1") == "Empty stdout! You might forget to print the answer."


def test_exception_keeps_last_two_stderr_lines(env):
    # stdout ("1") is dropped; the traceback's last two lines are the source line and the error
    assert observe(env, "print(1)\nprint(1/0)") == (
        "print(1/0)\nZeroDivisionError: division by zero\nErrors occurred! Check your code.")
    assert observe(env, "x = (") == "^\nSyntaxError: '(' was never closed\nErrors occurred! Check your code."


def test_timeout(env):
    assert observe(env, "while True:\n    pass") == "Tool API failed! Please try again."


def test_long_output_keeps_head_and_tail(env):
    obs = observe(env, "print('a' * 10000 + 'b' * 10000)")
    assert obs == "a" * 8192 + "...(truncated)..." + "b" * 8192


def test_result_rules_on_fabricated_results():
    def res(out="", err="", **kw):
        return SandboxResult(out, kw.pop("rc", 0), stderr=err, **kw)

    assert result_text(res("  7\n\n")) == "7"
    assert result_text(res("\n")) == ""  # released: only an empty stdout gets the hint
    assert result_text(res("ok\n", "  a  \n\n b \n c\n")) == "b\nc\nErrors occurred! Check your code."
    assert result_text(res("", "\n \n")) == "Errors occurred! Check your code."
    assert result_text(res("x", timed_out=True, error="timeout: ...")) == "Tool API failed! Please try again."
    assert result_text(res("", error="killed by signal SIGKILL (CPU time limit of 30 s)", rc=-9)) == \
        "Tool API failed! Please try again."
    assert result_text(res("", error="sandbox failure: OSError: x", rc=None)) == "Tool API failed! Please try again."
    assert result_text(res("", "MemoryError\n", error="memory limit of 1024 MB exceeded (MemoryError)", rc=1)) == \
        "MemoryError\nErrors occurred! Check your code."
    assert truncate_middle("abcdefgh", 4) == "ab...(truncated)...gh" and truncate_middle("abcd", 4) == "abcd"
    assert truncate_middle("abcdefgh", 5) == "ab...(truncated)...gh"  # half = 5 // 2


def test_prompt_suffix():
    e = make_env("code_math", tool_format="retool")
    assert e.reset(TASK) == [{"role": "user", "content": "What is 2+2?" + SUFFIX}]
    dapo = {"prompt": "Solve ... Answer: $Answer ...\n\nWhat is 2+2?\n\nRemember ...", "problem": "What is 2+2?",
            "answer": "4"}
    assert e.reset(dapo)[0]["content"] == dapo["prompt"] + SUFFIX  # released map_fn2: the dataset's message
    p = make_env("code_math", tool_format="retool", prompt_field="problem")
    assert p.reset(dapo)[0]["content"] == "What is 2+2?" + SUFFIX
    assert p.reset(TASK)[0]["content"] == "What is 2+2?" + SUFFIX  # no problem key: the prompt
    assert e.reset({"prompt": [{"role": "user", "content": "q"}], "answer": "1"})[0]["content"] == "q" + SUFFIX
    with_sys = make_env("code_math", tool_format="retool", system_prompt="S")
    assert [m["role"] for m in with_sys.reset(TASK)] == ["system", "user"]


def test_call_rule():
    p = ReToolCallParser()
    one = call("print(1)")
    assert p.parse(one).calls[0].arguments == {"code": "print(1)"}
    assert len(p.parse(one + call("print(2)")).calls) == 1  # max_parallel_calls: 1, the first runs
    t = p.parse('<tool_call>{bad</tool_call>' + call("print(3)"))
    assert t.kind == "tool" and t.calls[0].arguments["code"] == "print(3)"  # invalid JSON dropped
    assert p.parse("<tool_call>{bad</tool_call>" * 500).notes == [
        "a <tool_call> that is not JSON with 'name' and 'arguments' was dropped"]
    for text in ("<tool_call>{bad</tool_call> \\boxed{4}", "no call \\boxed{4}", "<tool_call>" + json.dumps(
            {"name": "code_interpreter", "arguments": {"code": "1"}}),  # no closing tag
            '<tool_call>{"name": "search", "arguments": {"q": 1}}</tool_call>',
            '<tool_call>{"name": "code_interpreter", "arguments": "print(1)"}</tool_call>',
            '<tool_call>{"name": "code_interpreter", "arguments": {"code": 5}}</tool_call>',
            '<tool_call>{"name": 3, "arguments": {}}</tool_call>'):
        assert p.parse(text).kind == "answer", text
    # a missing code argument runs the wrapper alone (released: parameters.get("code", ""))
    assert p.parse('<tool_call>{"name": "code_interpreter", "arguments": {}}</tool_call>').calls[0].arguments == \
        {"code": ""}
    assert extract_code("```python\n x = 1\n```") == "x = 1"
    assert extract_code("```py\nprint(2)\n``` and ```python\nprint(1)\n```") == "print(1)"
    assert extract_code("```py\nprint(2)\n```") == "print(2)"
    assert extract_code("print(3)") == "print(3)"
    check_parser_contract(p, who="ReToolCallParser")


def test_answer_check():
    assert strict_box_answer("so \\boxed{34}", "34") == ("34", True)
    assert strict_box_answer("so \\boxed{ 34}", "34") == (" 34", False)  # exact string equality
    assert strict_box_answer("\\boxed{34.0}", "34") == ("34.0", False)
    assert strict_box_answer("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}") == ("\\frac{1}{2}", True)
    assert strict_box_answer("\\boxed{34}" + "." * 95, "34") == (None, False)  # box starts before the last 100
    assert strict_box_answer("\\boxed{34}" + "." * 90, "34") == ("34", True)
    assert strict_box_answer("\\boxed{3} and \\boxed{4}", "4") == ("4", True)
    assert strict_box_answer("\\boxed{4", "4") == (None, False)
    assert strict_box_answer("The answer is 4.", "4") == (None, False)


def test_episode(env):
    env.reset(TASK)
    r = env.step(call("print(2 + 2)"))
    assert r.observation == "4" and not r.done
    r = env.step("It is \\boxed{4}")
    assert r.done and r.reward == 1.0
    s = env.episode_stats()
    assert s.tool_calls == 1 and s.queries_per_step == [1, 0] and s.has_answer and s.format_ok and s.success
    env.reset(TASK)
    r = env.step("<tool_call>{oops</tool_call> so \\boxed{4}")  # no valid call: the answer turn
    assert r.done and r.reward == 1.0 and not env.episode_stats().format_ok
    env.reset(TASK)
    assert env.step("\\boxed{ 4}").reward == -1.0


def test_turn_cut_by_max_turns_is_scored():
    e = make_env("code_math", tool_format="retool", max_turns=1)
    e.reset(TASK)
    r = e.step(call("print(1)") + " \\boxed{4}")
    assert r.done and r.reward == 1.0 and r.info["truncated"]
    d = make_env("code_math", parser="hermes", max_turns=1)  # the default format: a cut turn is wrong
    d.reset(TASK)
    assert d.step(call("print(1)") + " \\boxed{4}").reward == -1.0


def test_env_contract():
    check_env_contract(make_env("code_math", tool_format="retool"), TASK, who="code_math retool")


def test_bad_config_is_named():
    with pytest.raises(ValueError, match="unknown code tool format 'nope'"):
        make_env("code_math", tool_format="nope")
    with pytest.raises(ValueError, match="drop env_config.parser"):
        make_env("code_math", tool_format="retool", parser="hermes")
    with pytest.raises(ValueError, match="prompt_field must be one of"):
        make_env("code_math", tool_format="retool", prompt_field="question")
    with pytest.raises(ValueError, match="prompt_field must be one of"):
        make_env("code_math", prompt_field="problem")  # the default format has only the prompt


def test_numpy_missing_in_sandbox_is_a_clear_error():
    # without this environment's site-packages the sandboxed child has no numpy
    with pytest.raises(RuntimeError, match=r"needs numpy inside the code sandbox.*pip install numpy"):
        make_env("code_math", tool_format="retool", sandbox_config={"site_packages": False})


def test_format_is_a_record():
    fmt = get_tool_format("retool")
    assert fmt.parser is ReToolCallParser and not fmt.tag_results and fmt.score_truncated
    assert isinstance(ReToolCallParser().parse("x"), ParsedTurn)
