"""The parser registry: built-ins by name, user parsers selected through env_config, and the
errors for unknown or unsuitable parsers."""
import pytest

from rllib_spear.envs import make_env
from rllib_spear.envs.parsers import (
    PARSERS,
    ActionParser,
    CodeParser,
    HermesParser,
    ParsedTurn,
    SearchR1Parser,
    SpaderParser,
    ToolCall,
    extract_answer,
    get_parser,
    make_parser,
    parser_names,
    register_parser,
)
from rllib_spear.envs.parsers.registry import PARSER_REGISTRY


@pytest.fixture
def registered():
    """Register parsers for one test and remove them afterwards."""
    names = []

    def _reg(name, cls):
        register_parser(name, cls)
        names.append(name)
        return cls

    yield _reg
    for n in names:
        PARSER_REGISTRY.unregister(n)


def test_builtins_are_registered():
    assert {"search_r1", "spader", "hermes", "code", "action"} <= set(parser_names())
    for name, cls in [("search_r1", SearchR1Parser), ("spader", SpaderParser), ("hermes", HermesParser),
                      ("code", CodeParser), ("action", ActionParser)]:
        assert PARSERS[name] is cls
        assert isinstance(get_parser(name), cls)
        assert isinstance(make_parser(name), cls)


def test_unknown_parser_names_the_choices():
    with pytest.raises(ValueError) as e:
        get_parser("nope")
    msg = str(e.value)
    assert "unknown parser 'nope'" in msg and "search_r1" in msg and "register_parser" in msg
    with pytest.raises(ValueError, match="unknown parser 'nope'"):
        make_env("search_qa", parser="nope")


def test_duplicate_builtin_name_raises():
    with pytest.raises(ValueError, match="already registered"):
        register_parser("spader", SearchR1Parser)
    assert PARSERS["spader"] is SpaderParser


def test_kwargs_are_strict_env_options_are_offered():
    p = get_parser("spader", max_queries=3)
    assert p.max_queries == 3
    with pytest.raises(TypeError):
        get_parser("search_r1", max_queries=3)
    opts = {"tools": {"search": ("search", "query")}, "max_calls": 2, "max_queries": 5}
    assert isinstance(get_parser("search_r1", env_options=opts), SearchR1Parser)
    assert get_parser("spader", env_options=opts).max_queries == 5
    h = get_parser("hermes", env_options=opts)
    assert (h.max_calls, h.max_queries, h.call_names) == (2, 5, ("search",))


def test_env_options_match_the_earlier_construction():
    env = make_env("search_qa", parser="hermes", max_calls_per_turn=2, max_queries_per_call=3)
    assert isinstance(env.parser, HermesParser)
    assert (env.parser.tools, env.parser.max_calls, env.parser.max_queries) == (
        {"search": ("search", "query")}, 2, 3)
    env = make_env("multi_answer_search", max_queries_per_call=5)
    assert isinstance(env.parser, SpaderParser) and env.parser.max_queries == 5
    env = make_env("code_math", parser="hermes", max_calls_per_turn=3)
    assert env.parser.call_names == ("code_interpreter",) and env.parser.max_calls == 3
    assert env.tag == "tool_response" and make_env("code_math").tag == "interpreter"
    assert isinstance(make_env("text_game").parser, ActionParser)


@pytest.mark.parametrize("env_name,parser", [("search_qa", "code"), ("multi_answer_search", "action"),
                                             ("code_math", "spader"), ("code_math", "search_r1"),
                                             ("text_game", "code")])
def test_parser_whose_calls_the_env_cannot_run_is_refused(env_name, parser):
    with pytest.raises(ValueError, match=f"parser '{parser}' makes"):
        make_env(env_name, parser=parser)


class _BracketSearch:
    """[[query]] searches, anything else is the answer."""

    tag = "tool_response"
    call_names = ("search",)

    def __init__(self, max_queries: int = 8):
        self.max_queries = max_queries

    def parse(self, text: str) -> ParsedTurn:
        if "[[" in text and "]]" in text:
            q = text.split("[[", 1)[1].split("]]", 1)[0]
            return ParsedTurn("tool", calls=[ToolCall("search", {"queries": [q]})], num_queries=1)
        return ParsedTurn("answer", answer=extract_answer(text))


def test_user_parser_selected_from_env_config(registered, sqa_tasks):
    registered("bracket_search", _BracketSearch)
    assert "bracket_search" in parser_names()
    env = make_env("search_qa", parser="bracket_search", system_prompt="Search with [[q]].",
                   max_queries_per_call=2)
    assert isinstance(env.parser, _BracketSearch) and env.parser.max_queries == 2
    t = sqa_tasks[0]
    assert env.reset(t)[0]["content"] == "Search with [[q]]."
    r = env.step(f"[[{t['question']}]]")
    assert r.observation.startswith("<tool_response>") and not r.done
    r = env.step(f"<answer>{t['golden_answers'][0]}</answer>")
    assert r.done and r.reward == 1.0


def test_user_parser_without_a_prompt_asks_for_one(registered):
    registered("bracket_search", _BracketSearch)
    with pytest.raises(ValueError, match="system_prompt"):
        make_env("search_qa", parser="bracket_search")
    with pytest.raises(ValueError, match="system_prompt"):
        make_env("multi_answer_search", parser="bracket_search")


def test_user_code_parser(registered):
    @register_parser("run_tag")
    class RunTag:
        tag = "out"
        call_names = ("code_interpreter",)

        def parse(self, text):
            if text.startswith("RUN "):
                return ParsedTurn("tool", calls=[ToolCall("code_interpreter", {"code": text[4:]})], num_queries=1)
            return ParsedTurn("answer", answer=None)

    registered("run_tag", RunTag)  # already registered by the decorator: the same object is a no-op
    env = make_env("code_math", parser="run_tag", system_prompt="RUN code")
    assert env.tag == "out" and env.system_prompt == "RUN code"
    with pytest.raises(ValueError, match="system_prompt"):
        make_env("code_math", parser="run_tag")
