"""Random and adversarial assistant texts through every parser and every environment: nothing
escapes as an exception, observations are strings with their tags (or None when done)."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rllib_spear.envs import load_tasks, make_env
from rllib_spear.envs.parsers import PARSERS, check_think_format, extract_answer, extract_boxed

FRAGMENTS = ["<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>", "<tool_call>",
             "</tool_call>", "<code>", "</code>", "```python\n", "```", "<action>", "</action>", "\\boxed{",
             "{", "}", "[", "]", '"', "\\", '{"name": "search", "arguments": {"query": "x"}}',
             '{"name": "code_interpreter", "arguments": {"code": "print(1)"}}', '["Velmora", "Ossel"]',
             "print(1)", "import os", "null", "1e309", "\x00", "\ufffd", "go to kitchen", "Alder Quen",
             "<information>", "</tool_response>", "\n", " ", "é", "💥"]

texts = st.one_of(
    st.text(max_size=300),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=12)), max_size=25).map("".join),
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(texts)
def test_parsers_never_raise(text):
    for cls in PARSERS.values():
        r = cls().parse(text)
        assert r.kind in ("tool", "answer", "invalid")
        if r.kind == "invalid":
            assert isinstance(r.error, str) and r.error
    extract_answer(text)
    extract_boxed(text)
    check_think_format(text)


ENV_CONFIGS = [
    ("search_qa", {}), ("search_qa", {"parser": "hermes"}), ("search_qa", {"parser": "spader"}),
    ("multi_answer_search", {}), ("multi_answer_search", {"parser": "hermes", "result_format": "json"}),
    ("text_game", {}),
]


@pytest.fixture(scope="module")
def envs_and_tasks():
    out = []
    for name, cfg in ENV_CONFIGS:
        out.append((make_env(name, max_turns=3, **cfg), load_tasks(name)[0]))
    return out


@SETTINGS
@given(st.lists(texts, min_size=1, max_size=4))
def test_envs_never_raise(envs_and_tasks, turns):
    for env, task in envs_and_tasks:
        env.reset(task)
        for t in turns:
            r = env.step(t)
            assert isinstance(r.reward, float) or isinstance(r.reward, int)
            if r.done:
                assert r.observation is None
                break
            assert isinstance(r.observation, str) and r.observation.startswith("<") and r.observation.endswith(">")
        s = env.episode_stats()
        assert {"tool_calls", "queries_per_step", "success", "format_ok", "has_answer", "outcome_reward"} <= set(s)
        assert len(s["queries_per_step"]) == env.turns
        if "found_entities_per_step" in s:
            assert len(s["found_entities_per_step"]) == len(s["queries_per_step"])


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(texts, min_size=1, max_size=2))
def test_code_env_never_raises(turns):
    env = make_env("code_math", max_turns=3, sandbox_config={"wall_timeout_s": 2.0, "cpu_time_s": 1})
    env.reset(load_tasks("code_math")[0])
    for t in turns:
        r = env.step(t)
        if r.done:
            break
        assert r.observation.startswith("<interpreter>")
