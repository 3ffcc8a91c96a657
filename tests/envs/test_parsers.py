import pytest

from rllib_spear.envs.parsers import (
    ActionParser,
    CodeParser,
    HermesParser,
    SearchR1Parser,
    SpaderParser,
    check_think_format,
    extract_answer,
    extract_boxed,
)


def test_extract_answer_and_boxed():
    assert extract_answer("<answer>a</answer> x <answer> b </answer>") == "b"
    assert extract_answer("<answer>unclosed") is None
    assert extract_boxed(r"so \boxed{12} then \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert extract_boxed(r"\boxed{1") is None
    assert extract_boxed("nothing") is None


def test_think_format():
    assert check_think_format("<think>a</think><think>b</think>") is None
    assert "nested" in check_think_format("<think><think></think></think>")
    assert "without" in check_think_format("a</think>")
    assert "unclosed" in check_think_format("<think>a")


def test_search_r1():
    p = SearchR1Parser()
    r = p.parse("<think>x</think><search> Alder Quen </search>")
    assert r.kind == "tool" and r.calls[0].arguments["queries"] == ["Alder Quen"] and r.num_queries == 1
    assert p.parse("<answer>Velmora</answer>").answer == "Velmora"
    # first complete tag wins (Search-R1 regex)
    assert p.parse("<answer>A</answer><search>q</search>").kind == "answer"
    assert p.parse("<search>q</search><answer>A</answer>").kind == "tool"
    assert p.parse("<search>a</search><search>b</search>").kind == "invalid"
    assert "unclosed" in p.parse("<search>abc").error
    assert p.parse("hello").kind == "invalid"
    assert p.parse("<search>  </search>").kind == "invalid"


def test_spader_counting_and_last_block():
    p = SpaderParser()
    r = p.parse('<tool_call>["a", "b"]</tool_call> <tool_call>not json</tool_call> <tool_call>["c"]</tool_call>')
    assert r.kind == "tool" and r.calls[0].arguments["queries"] == ["c"]
    assert r.num_queries == 2 + 1 + 1  # a non-JSON block counts as 1 (docs/algorithms.md 3.2)
    assert r.notes
    r = p.parse('<tool_call>["a"]</tool_call><tool_call>{oops</tool_call>')
    assert r.kind == "invalid" and r.num_queries == 2
    r = p.parse('<tool_call>{"name": "search", "arguments": {"query_list": ["x", "y"]}}</tool_call>')
    assert r.kind == "tool" and r.calls[0].arguments["queries"] == ["x", "y"]
    assert p.parse('<answer>["A"]</answer>').kind == "answer"
    assert p.parse("<tool_call>[\"a\"]").kind == "invalid"
    assert p.parse("<tool_call>[]</tool_call>").kind == "invalid"
    assert p.parse("<tool_call>[1, 2]</tool_call>").calls[0].arguments["queries"] == ["1", "2"]


def test_hermes():
    p = HermesParser({"search": ("search", "query"), "code_interpreter": ("code_interpreter", "code")})
    r = p.parse('<tool_call>{"name": "search", "arguments": {"query": "q1"}}</tool_call>'
                '<tool_call>{"name": "code_interpreter", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call>')
    assert r.kind == "tool" and [c.name for c in r.calls] == ["search", "code_interpreter"]
    assert r.calls[1].arguments["code"] == "print(1)"
    r = p.parse('<tool_call>{"name": "nope", "arguments": {}}</tool_call>')
    assert r.kind == "invalid" and "unknown tool" in r.error
    r = p.parse('<tool_call>{"name": "search", "arguments": {"query": "a"}}</tool_call><tool_call>{bad</tool_call>')
    assert r.kind == "tool" and r.calls[1].error
    assert p.parse("<tool_call>" * 10 + "</tool_call>" * 10).kind in ("invalid", "tool")
    assert HermesParser(max_calls=1).parse("<tool_call>{}</tool_call>" * 2).kind == "invalid"


def test_code_parser():
    p = CodeParser()
    r = p.parse("<code>\n```python\nprint(2)\n```\n</code>")
    assert r.kind == "tool" and r.calls[0].arguments["code"].strip() == "print(2)"
    r = p.parse("text\n```python\nx=1\nprint(x)\n```\n")
    assert r.kind == "tool" and "print(x)" in r.calls[0].arguments["code"]
    assert p.parse("```python\nx=1\n").kind == "invalid"
    assert p.parse("<code>a</code><code>b</code>").kind == "invalid"
    assert p.parse(r"The answer is \boxed{7}.").answer == "7"
    assert p.parse("```\nnot python fence\n```").kind == "answer"


def test_action_parser():
    p = ActionParser()
    assert p.parse("<think>x</think><action> go  to kitchen </action>").calls[0].arguments["action"] == "go to kitchen"
    assert p.parse("<action>a</action><action>b</action>").kind == "invalid"
    assert p.parse("go to kitchen").kind == "invalid"


@pytest.mark.parametrize("parser", [SearchR1Parser(), SpaderParser(), HermesParser(), CodeParser(), ActionParser()])
def test_pathological_inputs_are_fast(parser):
    import time

    for text in ["<search>" * 30000, "<tool_call>" * 20000, "```python\n" * 20000, "\\boxed{" * 20000,
                 "<code>" * 20000, "<think>" * 30000, "<answer>" * 30000, "x" * 1_000_000]:
        t = time.perf_counter()
        parser.parse(text)
        extract_boxed(text)
        check_think_format(text)
        assert time.perf_counter() - t < 2.0
