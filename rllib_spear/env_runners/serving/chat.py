"""OpenAI chat messages <-> the policy's token ids (docs/design.md "The OpenAI endpoint").

:class:`ChatRenderer` turns a request's messages (and tools) into prompt token ids with the
tokenizer's chat template, and renders only what a request *adds* after an earlier call's
completion, so that the endpoint continues from the sampled ids (token-in/token-out):

    before = template(messages[:k+1])                       (the earlier call's messages + its reply)
    after  = template(messages, add_generation_prompt=True) (this request)
    ids    = prompt_ids(earlier call) + completion_ids(earlier call) + encode(rest_of_closing + after[len(before):])

``rest_of_closing`` is what the template writes after an assistant turn's content (ChatML:
``<|im_end|>\\n``) less the end-of-turn token the model sampled itself. A template that
re-renders earlier turns when a message is added (``after`` does not start with ``before``; Qwen3
drops earlier thinking) cannot be continued: the request is templated whole (the call becomes a
sample of its own, core/call_layout.py).

Tools. A template that renders ``tools`` itself (Qwen2.5/Qwen3, Hermes) gets them as they are;
one that ignores them (SmolLM2, the embedded models) gets the Hermes block that Qwen2.5's template
writes, in the system message, with tool results as a user turn of ``<tool_response>`` blocks and
earlier tool calls as ``<tool_call>`` blocks (``tools="hermes_system"``); ``tools="chat_template"``
refuses tools on such a template instead. Completions are read in the Hermes format either way:
every ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block naming an offered tool is
a call (:func:`parse_tool_calls`).
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

from ..text_safety import safe_text
from ...envs.parsers.base import _blocks
from .errors import EndpointError

__all__ = ["ChatRenderer", "ParsedCompletion", "TOOL_MODES", "canonical", "normalize_messages",
           "parse_tool_calls", "hermes_tools_block"]

#: How tools reach a template that does not render them (see the module doc).
TOOL_MODES = ("hermes_system", "chat_template")
_ROLES = ("system", "developer", "user", "assistant", "tool")
_PROBE = "ASSISTANT_PROBE_5e1c"


def hermes_tools_block(tools: Sequence[dict[str, Any]]) -> str:
    """The tools block of Qwen2.5's chat template (the Hermes format the parsers read)."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{lines}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def _text(content: Any, where: str) -> str:
    """A message's content as one string (OpenAI allows a list of text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return safe_text(content)
    if isinstance(content, list):
        out = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise EndpointError(f"{where}: only text content parts are served (got a {kind!r} part)",
                                    param="messages")
            out.append(part["text"])
        return safe_text("".join(out))
    raise EndpointError(f"{where}: content must be a string, a list of text parts or null", param="messages")


def _arguments(raw: Any, where: str) -> dict[str, Any]:
    """A tool call's arguments (OpenAI sends a JSON string) as a dict."""
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw) if isinstance(raw, str) and raw.strip() else {}
    except ValueError as e:
        raise EndpointError(f"{where}: function.arguments is not valid JSON ({e})", param="messages") from None
    if not isinstance(value, dict):
        raise EndpointError(f"{where}: function.arguments must be a JSON object", param="messages")
    return value


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """The request's messages as plain dicts: ``role``, ``content`` (one string), and for an
    assistant ``tool_calls`` ``[{"name", "arguments": dict}]``; a ``developer`` message is a
    system message. Anything else a 400 naming the message."""
    if not isinstance(messages, list) or not messages:
        raise EndpointError("messages must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            role = m.get("role") if isinstance(m, dict) else None
            raise EndpointError(f"{where}: role must be one of {list(_ROLES)}, got {role!r}", param="messages")
        role = "system" if m["role"] == "developer" else m["role"]
        msg: dict[str, Any] = {"role": role, "content": _text(m.get("content"), where)}
        if role == "assistant" and m.get("tool_calls"):
            calls = []
            for j, c in enumerate(m["tool_calls"]):
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise EndpointError(f"{where}.tool_calls[{j}]: expected {{'type': 'function', 'function': "
                                        "{'name': ..., 'arguments': ...}}", param="messages")
                calls.append({"name": fn["name"], "arguments": _arguments(fn.get("arguments"), f"{where}.tool_calls[{j}]")})
            msg["tool_calls"] = calls
        out.append(msg)
    return out


def canonical(value: Any) -> str:
    """One string per value, equal for equal JSON values (keys sorted): how the endpoint tells
    that a request repeats earlier messages."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


@dataclass
class ParsedCompletion:
    """A completion's text as an OpenAI assistant message: ``content`` (None when it is only tool
    calls), ``tool_calls`` ``[{"name", "arguments": dict}]`` and how many ``<tool_call>`` blocks
    could not be read (malformed JSON, an unknown tool: they stay in ``content``)."""

    content: str | None
    tool_calls: list[dict[str, Any]]
    malformed: int = 0

    def message(self) -> dict[str, Any]:
        """The normalized form of this reply (what :func:`normalize_messages` makes of it)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content or ""}
        if self.tool_calls:
            msg["tool_calls"] = [dict(c) for c in self.tool_calls]
        return msg

    def openai_message(self) -> dict[str, Any]:
        """The reply as OpenAI's ``choices[0].message``."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                                  "function": {"name": c["name"], "arguments": json.dumps(c["arguments"],
                                                                                          ensure_ascii=False)}}
                                 for c in self.tool_calls]
        return msg


def parse_tool_calls(text: str, tool_names: Sequence[str]) -> ParsedCompletion:
    """Read the Hermes ``<tool_call>`` blocks of ``text`` that call one of ``tool_names``."""
    blocks, _ = _blocks(text, "tool_call")
    calls, malformed, content = [], 0, text
    for block in blocks:
        try:
            obj = json.loads(block.strip())
        except (ValueError, RecursionError):
            obj = None
        args = obj.get("arguments", {}) if isinstance(obj, dict) else None
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):
                args = None
        if not isinstance(obj, dict) or obj.get("name") not in tool_names or not isinstance(args, dict):
            malformed += 1
            continue
        calls.append({"name": obj["name"], "arguments": args})
        content = content.replace(f"<tool_call>{block}</tool_call>", "", 1)
    content = content.strip() if calls else content
    return ParsedCompletion(content if content or not calls else None, calls, malformed)


class ChatRenderer:
    """Messages -> prompt token ids with ``tokenizer``'s chat template (see the module doc).

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        tools: ``"hermes_system"`` (a template that ignores tools gets the Hermes block) or
            ``"chat_template"`` (tools only where the template renders them; else 400).
    """

    def __init__(self, tokenizer: Any, tools: str = "hermes_system") -> None:
        if tools not in TOOL_MODES:
            raise ValueError(f"serve_openai tools must be one of {TOOL_MODES}, got {tools!r}")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the OpenAI endpoint needs a tokenizer with a chat template (/v1/chat/completions "
                             "renders messages with it)")
        self.tokenizer = tokenizer
        self.tool_mode = tools
        self.eos_id = tokenizer.eos_token_id
        self.eos_text = tokenizer.eos_token or ""
        self.native_tools = self._renders_tools()
        self.closing = self._assistant_closing()

    # ------------------------------------------------------------------ template probes
    def _template(self, messages: list[dict[str, Any]], add_generation_prompt: bool, **extra: Any) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                  **extra)

    def _renders_tools(self) -> bool:
        """Whether the template writes a ``tools`` argument into the prompt."""
        msgs = [{"role": "user", "content": "USER_PROBE"}]
        tool = {"type": "function", "function": {"name": "probe_tool_3b7f", "description": "d",
                                                 "parameters": {"type": "object", "properties": {}}}}
        try:
            return "probe_tool_3b7f" in self._template(msgs, True, tools=[tool])
        except Exception:  # a template that raises on tools does not support them
            return False

    def _assistant_closing(self) -> str | None:
        """What the template writes after an assistant turn's content (None: it cannot be found,
        no request is continued)."""
        msgs = [{"role": "user", "content": "USER_PROBE"}, {"role": "assistant", "content": _PROBE}]
        try:
            text = self._template(msgs, False)
        except Exception:
            return None
        return text[text.rfind(_PROBE) + len(_PROBE):] if _PROBE in text else None

    # ------------------------------------------------------------------ rendering
    def check_tools(self, tools: list[dict[str, Any]] | None) -> None:
        """400 when tools are offered to a template that does not render them and the tool mode
        is ``"chat_template"``."""
        if tools and not self.native_tools and self.tool_mode == "chat_template":
            raise EndpointError("this model's chat template does not render tools; serve them in the Hermes format "
                                "with .env_runners(serve_openai={'tools': 'hermes_system'}), or describe the tools "
                                "in your own system message", param="tools")

    def _for_template(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
                      ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Messages (and the template's keyword arguments) in the form the template reads."""
        if self.native_tools:
            out = []
            for m in messages:
                m = dict(m)
                if m.get("tool_calls"):  # the form transformers' tool-using templates read
                    m["tool_calls"] = [{"type": "function", "function": dict(c)} for c in m["tool_calls"]]
                out.append(m)
            return out, ({"tools": list(tools)} if tools else {})
        out = []
        for m in messages:
            if m["role"] == "tool":
                wrapped = f"<tool_response>\n{m['content']}\n</tool_response>"
                if out and out[-1].get("_tool_results"):
                    out[-1]["content"] += "\n" + wrapped
                else:
                    out.append({"role": "user", "content": wrapped, "_tool_results": True})
                continue
            content = m["content"]
            for c in m.get("tool_calls") or []:
                call = json.dumps({"name": c["name"], "arguments": c["arguments"]}, ensure_ascii=False)
                content += f"\n<tool_call>\n{call}\n</tool_call>"
            out.append({"role": m["role"], "content": content})
        out = [{"role": m["role"], "content": m["content"]} for m in out]
        if tools:
            block = hermes_tools_block(tools)
            if out and out[0]["role"] == "system":
                out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{block}"}
            else:
                out.insert(0, {"role": "system", "content": block})
        return out, {}

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               add_generation_prompt: bool = True) -> str:
        msgs, extra = self._for_template(messages, tools)
        try:
            return self._template(msgs, add_generation_prompt, **extra)
        except Exception as e:  # a template that rejects this conversation (turn order, roles)
            raise EndpointError(f"the model's chat template cannot render these messages ({type(e).__name__}: {e})",
                                param="messages") from None

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """The tokens of the whole conversation with the generation prompt (no continuation)."""
        return self.encode(self.render(messages, tools))

    def continuation_ids(self, messages: list[dict[str, Any]], reply_index: int,
                         tools: list[dict[str, Any]] | None, closed: bool) -> list[int] | None:
        """The tokens to append after an earlier call's prompt and completion ids, where
        ``messages[reply_index]`` is that call's reply (see the module doc); ``closed``: the
        completion ended with the end-of-turn token. None when the template does not extend."""
        if self.closing is None:
            return None
        before = self.render(messages[:reply_index + 1], tools, add_generation_prompt=False)
        after = self.render(messages, tools)
        if not after.startswith(before):
            return None
        rest = self.closing
        if closed and self.eos_text and rest.startswith(self.eos_text):
            rest = rest[len(self.eos_text):]
        return self.encode(rest + after[len(before):])

    def decode(self, ids: Sequence[int]) -> str:
        """The text of sampled ids, special tokens (the end-of-turn token) left out."""
        return safe_text(self.tokenizer.decode(list(ids), skip_special_tokens=True))
