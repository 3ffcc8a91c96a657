"""Worst-case inputs (issue "Part 9"): every parser is linear time up to the parse cap, tool calls
and queries per turn are capped, and observations (headers, JSON skeleton and echoes included)
stay within the env's budget. Time limits are generous per-call budgets, not benchmarks."""
import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rllib_spear.envs import load_tasks, make_env
from rllib_spear.envs.parsers import (
    MAX_CALLS_PER_TURN,
    MAX_ECHO_CHARS,
    MAX_PARSE_CHARS,
    MAX_QUERIES_PER_CALL,
    PARSERS,
    CodeParser,
    HermesParser,
    SpaderParser,
    _strip_fence,
    check_think_format,
    extract_answer,
    extract_boxed,
)

BUDGET_S = 1.0  # generous: the linear parsers take milliseconds on 200k characters
FENCE = "`" * 3
HERMES_CODE = {"code_interpreter": ("code_interpreter", "code"), "python": ("code_interpreter", "code")}


def _timed(fn, *a):
    t = time.perf_counter()
    out = fn(*a)
    return out, time.perf_counter() - t


def _fence_ws(n):
    return "<code>" + FENCE + " " * n + "x</code>"


@pytest.mark.parametrize("n", [60_000, MAX_PARSE_CHARS - 20])
def test_fence_with_long_whitespace_is_linear(n):
    text = _fence_ws(n)
    r, dt = _timed(CodeParser().parse, text)
    assert dt < BUDGET_S and r.kind == "tool"
    _, dt = _timed(_strip_fence, FENCE + " " * n + "python" + " " * 50 + "x")
    assert dt < BUDGET_S
    code = json.dumps(FENCE + " " * (n - 100) + "x")  # the call wrapper fits under the cap
    call = '<tool_call>{"name": "code_interpreter", "arguments": {"code": %s}}</tool_call>' % code
    r, dt = _timed(HermesParser(HERMES_CODE).parse, call)
    assert dt < BUDGET_S and r.kind == "tool"
    for parser in ("code", "hermes"):  # what both code_math envs parse with
        env = make_env("code_math", parser=parser)
        _, dt = _timed(env.parser.parse, text if parser == "code" else call)
        assert dt < BUDGET_S


def _query_list_call(n):
    return '<tool_call>{"name": "search", "arguments": {"query_list": %s}}</tool_call>' % json.dumps(
        [str(i) for i in range(n)])  # 20k queries ~ 180k characters, under the parse cap


def test_hermes_query_list_is_capped():
    r = HermesParser().parse(_query_list_call(20_000))
    assert r.kind == "tool" and len(r.calls[0].arguments["queries"]) == MAX_QUERIES_PER_CALL == 8
    assert r.num_queries == 20_000 and r.notes  # charged what was asked for, told about the cap
    r = HermesParser(max_queries=3).parse(_query_list_call(50))
    assert len(r.calls[0].arguments["queries"]) == 3
    assert len(SpaderParser().parse("<tool_call>%s</tool_call>" % json.dumps(["q"] * 50)).calls[0]
               .arguments["queries"]) == MAX_QUERIES_PER_CALL


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("max_chars", [600, 10_000])
def test_search_observation_is_bounded(fmt, max_chars):
    env = make_env("multi_answer_search", parser="hermes", result_format=fmt, max_chars=max_chars)
    env.reset(load_tasks("multi_answer_search")[0])
    long_q = "Velmora " * 600
    text = _query_list_call(20_000).replace('"0"', json.dumps(long_q), 1)
    assert len(text) < MAX_PARSE_CHARS
    r, dt = _timed(env.step, text)
    assert dt < 5.0  # was 5-6 s for 20k searches; now 8 queries are run
    assert len(r.observation) <= env.obs_budget and r.observation.endswith("</tool_response>")
    assert long_q not in r.observation
    # several parallel calls share the budget
    env.reset(load_tasks("multi_answer_search")[0])
    text = _query_list_call(2_000).replace('"0"', json.dumps(long_q), 1)
    r = env.step(text * MAX_CALLS_PER_TURN)
    assert r.observation.count("<tool_response>") == MAX_CALLS_PER_TURN
    assert len(r.observation) <= env.obs_budget
    env.reset(load_tasks("multi_answer_search")[0])
    assert env.step(text * (MAX_CALLS_PER_TURN + 1)).info["error"].startswith("at most")


def test_unknown_tool_name_echo_is_cut():
    name = "n" * 150_000
    call = '<tool_call>{"name": "%s", "arguments": {}}</tool_call>' % name
    r = HermesParser().parse(call)
    assert r.kind == "invalid" and "unknown tool" in r.error and len(r.error) < MAX_ECHO_CHARS + 100
    env = make_env("search_qa", parser="hermes")
    env.reset(load_tasks("search_qa")[0])
    obs = env.step(call).observation
    assert len(obs) < 400 and name not in obs
    env = make_env("code_math", parser="hermes")
    env.reset(load_tasks("code_math")[0])
    obs = env.step(call).observation
    assert len(obs) < 400 and obs.startswith("<tool_response>")
    # a known tool next to it: the error slot is cut as well
    both = call + '<tool_call>{"name": "search", "arguments": {"query": "Velmora"}}</tool_call>'
    env = make_env("search_qa", parser="hermes", max_chars=800)
    env.reset(load_tasks("search_qa")[0])
    assert len(env.step(both).observation) <= env.obs_budget


# ---- property: long adversarial strings through every parser -------------------------------

PIECES = ["<search>", "</search>", "<answer>", "</answer>", "<tool_call>", "</tool_call>", "<code>", "</code>",
          FENCE, FENCE + "python", FENCE + "py ", "<action>", "</action>", "<think>", "</think>", "\\boxed{",
          "\\boxed ", "{", "}", "[", "]", "[\"q\", ", '"', "\\", ":", ",", " ", "\t", "\n", "x", "python",
          '{"name": "search", "arguments": {"query_list": [', '{"name": "code_interpreter", "arguments": {"code": "',
          '{"name": "', "é", "💥"]

long_texts = st.tuples(
    st.lists(st.sampled_from(PIECES), min_size=1, max_size=6),
    st.sampled_from(PIECES),
    st.integers(1_000, MAX_PARSE_CHARS + 10_000),
).map(lambda t: ("".join(t[0]) + t[1] * (t[2] // len(t[1])) + "".join(reversed(t[0])))[: t[2]])


def _all_parsers():
    return [cls() for cls in PARSERS.values()] + [HermesParser(HERMES_CODE)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(long_texts)
def test_long_adversarial_inputs_are_fast_and_bounded(text):
    for p in _all_parsers():
        r, dt = _timed(p.parse, text)
        assert dt < BUDGET_S, (p.name, len(text))
        assert r.kind in ("tool", "answer", "invalid")
        assert len(r.calls) <= getattr(p, "max_calls", 1)
        for c in r.calls:
            assert len(c.arguments.get("queries", [])) <= getattr(p, "max_queries", MAX_QUERIES_PER_CALL)
        if r.error:
            assert len(r.error) < 2_000
    for fn in (extract_answer, extract_boxed, check_think_format, _strip_fence):
        _, dt = _timed(fn, text)
        assert dt < BUDGET_S, fn.__name__


@pytest.fixture(scope="module")
def search_envs():
    return [(make_env(n, max_chars=1000, **cfg), load_tasks(n)[0]) for n, cfg in [
        ("search_qa", {}), ("search_qa", {"parser": "hermes"}), ("search_qa", {"parser": "spader"}),
        ("multi_answer_search", {}), ("multi_answer_search", {"parser": "hermes", "result_format": "json"})]]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(long_texts)
def test_long_adversarial_search_observations_are_bounded(search_envs, text):
    for env, task in search_envs:
        env.reset(task)
        r = env.step(text)
        if r.observation is not None:
            assert len(r.observation) <= env.obs_budget
