"""Messages -> token ids (serving/chat.py): what a request adds after an earlier call is rendered
alone and appended to the sampled ids; tools in the template's own format or the Hermes block;
tool calls read from completions."""
from __future__ import annotations

import copy

import pytest
from transformers import AutoTokenizer

from rllib_spear.models.factory import tiny_model_path
from rllib_spear.env_runners.serving.chat import ChatRenderer, normalize_messages, parse_tool_calls
from rllib_spear.env_runners.serving.errors import EndpointError

TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
                                           "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                                          "required": ["expression"]}}}]

#: A Qwen2.5-style template that renders tools itself (the tiny model's renders none).
QWEN_LIKE = (
    "{%- if tools %}<|im_start|>system\n{{ messages[0]['content'] if messages[0]['role'] == 'system' else 'You help.' }}"
    "\n\n# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools><|im_end|>\n"
    "{%- elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}{%- if m.role == 'system' %}{%- elif m.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- for c in (m.tool_calls or []) %}\n<tool_call>\n{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}\n</tool_call>{%- endfor %}"
    "<|im_end|>\n{%- endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(tiny_model_path())


@pytest.fixture(scope="module")
def qwen_tok(tok):
    t = copy.deepcopy(tok)
    t.chat_template = QWEN_LIKE
    return t


def _conversation():
    return normalize_messages([
        {"role": "system", "content": "You compute."},
        {"role": "user", "content": "What is 6*7?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ])


@pytest.mark.parametrize("which", ["tiny", "qwen"])
def test_continuation_is_the_rest_of_the_templated_conversation(tok, qwen_tok, which):
    """On a canonical tokenization, earlier prompt + sampled reply + continuation == the whole
    conversation templated at once: the continuation adds exactly what the template adds."""
    r = ChatRenderer(tok if which == "tiny" else qwen_tok)
    msgs = _conversation()
    first = r.prompt_ids(msgs[:2], TOOLS)
    reply_text = r.render(msgs[:3], TOOLS, add_generation_prompt=False)[len(r.render(msgs[:2], TOOLS)):]
    reply_ids = r.encode(reply_text[:reply_text.rindex(r.eos_text)]) + [r.eos_id]
    rest = r.continuation_ids(msgs, 2, TOOLS, closed=True)
    assert first + reply_ids + rest == r.prompt_ids(msgs, TOOLS)
    # not closed (stopped at its token cap): the template's closing is added whole
    assert r.continuation_ids(msgs, 2, TOOLS, closed=False)[0] == r.eos_id


def test_tools_reach_a_template_without_them_as_the_hermes_block(tok):
    r = ChatRenderer(tok)
    assert not r.native_tools
    text = r.render(_conversation(), TOOLS)
    assert text.startswith("<|im_start|>system\nYou compute.\n\n# Tools") and '"name": "calculator"' in text
    assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>" in text
    with pytest.raises(EndpointError, match="does not render tools") as e:
        ChatRenderer(tok, tools="chat_template").check_tools(TOOLS)
    assert e.value.status == 400 and e.value.param == "tools"


def test_a_template_with_tools_renders_them_itself(qwen_tok):
    r = ChatRenderer(qwen_tok, tools="chat_template")
    assert r.native_tools
    r.check_tools(TOOLS)
    assert '"description": "Evaluate arithmetic."' in r.render(_conversation(), TOOLS)


def test_tool_calls_are_read_from_hermes_blocks():
    text = ('Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'
            '<tool_call>{"name": "nope", "arguments": {}}</tool_call><tool_call>not json</tool_call>')
    p = parse_tool_calls(text, ["calculator"])
    assert p.tool_calls == [{"name": "calculator", "arguments": {"expression": "6*7"}}] and p.malformed == 2
    assert p.content.startswith("Let me compute.") and "nope" in p.content
    msg = p.openai_message()
    assert msg["tool_calls"][0]["function"] == {"name": "calculator", "arguments": '{"expression": "6*7"}'}
    only = parse_tool_calls('<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1\\"}"}</tool_call>',
                            ["calculator"])
    assert only.content is None and only.tool_calls[0]["arguments"] == {"expression": "1"}


@pytest.mark.parametrize("bad, match", [
    ([], "non-empty list"), ([{"role": "robot", "content": "x"}], "role"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "only text"),
    ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}], "JSON"),
])
def test_malformed_messages_are_refused_naming_the_message(bad, match):
    with pytest.raises(EndpointError, match=match):
        normalize_messages(bad)
