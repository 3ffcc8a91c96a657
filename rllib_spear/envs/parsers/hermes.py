"""The ``hermes`` parser: Qwen/hermes JSON tool calls, several per turn."""
from __future__ import annotations

import json

from .base import (
    MAX_CALLS_PER_TURN,
    MAX_QUERIES_PER_CALL,
    ParsedTurn,
    ToolCall,
    _blocks,
    _clean_queries,
    _cut,
    echo,
    extract_answer,
)
from .code import _strip_fence
from .registry import register_parser

__all__ = ["HermesParser"]


@register_parser("hermes")
class HermesParser:
    """Qwen/hermes ``<tool_call>{"name": "...", "arguments": {...}}</tool_call>`` blocks.

    ``tools`` maps the tool name the model uses to the canonical call name and its argument key,
    e.g. ``{"search": ("search", "query"), "code_interpreter": ("code_interpreter", "code")}``.
    """

    name = "hermes"
    tag = "tool_response"

    def __init__(self, tools: dict[str, tuple[str, str]] | None = None, max_calls: int = MAX_CALLS_PER_TURN,
                 max_queries: int = MAX_QUERIES_PER_CALL):
        self.tools = tools or {"search": ("search", "query")}
        self.max_calls = max(1, int(max_calls))
        self.max_queries = max(1, int(max_queries))

    @property
    def call_names(self) -> tuple[str, ...]:
        """The canonical call names of ``tools``."""
        return tuple(sorted({canon for canon, _ in self.tools.values()}))

    def _one(self, block: str, notes: list[str] | None = None) -> tuple[ToolCall, int]:
        try:
            obj = json.loads(block.strip())
        except (ValueError, RecursionError) as e:
            return ToolCall("error", {}, error=f"tool call is not valid JSON ({type(e).__name__})"), 1
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return ToolCall("error", {}, error='expected {"name": ..., "arguments": {...}}'), 1
        name = obj["name"]
        if name not in self.tools:
            return ToolCall("error", {}, error=f"unknown tool {echo(name)}; available: {sorted(self.tools)}"), 1
        args = obj.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):
                args = None
        if not isinstance(args, dict):
            return ToolCall("error", {}, error="arguments must be a JSON object"), 1
        canon, key = self.tools[name]
        if canon == "search":
            ql = args.get(key, args.get("query_list", args.get("queries")))
            if isinstance(ql, str):
                ql = [ql]
            if not isinstance(ql, list) or not all(isinstance(q, str) for q in ql):
                return ToolCall("error", {}, error=f"argument {key!r} must be a string"), 1
            qs = _clean_queries(ql)
            if not qs:
                return ToolCall("error", {}, error="empty query"), 1
            n = len(qs)  # the requested count is what the step is charged (as for spader)
            if n > self.max_queries:
                qs = qs[: self.max_queries]
                if notes is not None:
                    notes.append(f"only the first {self.max_queries} queries of a call were run")
            return ToolCall("search", {"queries": qs}), n
        val = args.get(key)
        if not isinstance(val, str) or not val.strip():
            return ToolCall("error", {}, error=f"argument {key!r} must be a non-empty string"), 1
        if canon == "code_interpreter":
            val = _strip_fence(val)
        return ToolCall(canon, {key if canon != "code_interpreter" else "code": val}), 1

    def parse(self, text: str) -> ParsedTurn:
        text = _cut(text)
        blocks, unclosed = _blocks(text, "tool_call")
        if not blocks:
            if unclosed:
                return ParsedTurn("invalid", error="unclosed <tool_call> tag")
            return ParsedTurn("answer", answer=extract_answer(text))
        if len(blocks) > self.max_calls:
            return ParsedTurn("invalid", error=f"at most {self.max_calls} tool calls per turn",
                              num_queries=len(blocks))
        calls, n, notes = [], 0, []
        for b in blocks:
            c, k = self._one(b, notes)
            calls.append(c)
            n += k
        notes = list(dict.fromkeys(notes))
        if all(c.error for c in calls):
            return ParsedTurn("invalid", error="; ".join(c.error for c in calls), num_queries=n)
        return ParsedTurn("tool", calls=calls, num_queries=n, notes=notes)
