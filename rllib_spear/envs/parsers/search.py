"""Search-call parsers: ``search_r1`` (``<search>q</search>``) and ``spader``
(``<tool_call>["q1", "q2"]</tool_call>``)."""
from __future__ import annotations

import json

from .base import (
    MAX_QUERIES_PER_CALL,
    ParsedTurn,
    ToolCall,
    _blocks,
    _clean_queries,
    _cut,
    _first_complete,
    extract_answer,
    parse_json_list_of_strings,
)
from .registry import register_parser

__all__ = ["SearchR1Parser", "SpaderParser"]


@register_parser("search_r1")
class SearchR1Parser:
    """``<search>query</search>`` or ``<answer>..</answer>`` (Search-R1)."""

    name = "search_r1"
    tag = "information"
    call_names = ("search",)

    def parse(self, text: str) -> ParsedTurn:
        text = _cut(text)
        m = _first_complete(text, ("search", "answer"))
        n_search = len(_blocks(text, "search")[0])
        if m is None:
            if "<search>" in text or "<answer>" in text:
                return ParsedTurn("invalid", error="unclosed <search> or <answer> tag", num_queries=0)
            return ParsedTurn(
                "invalid",
                error="no action. To search, put the query between <search> and </search>. "
                "To answer, put the answer between <answer> and </answer>.",
            )
        if m[0] == "answer":
            return ParsedTurn("answer", answer=m[1].strip())
        if n_search > 1:
            return ParsedTurn("invalid", error="only one <search> per turn", num_queries=n_search)
        q = _clean_queries([m[1]])
        if not q:
            return ParsedTurn("invalid", error="empty search query", num_queries=1)
        return ParsedTurn("tool", calls=[ToolCall("search", {"queries": q})], num_queries=1)


@register_parser("spader")
class SpaderParser:
    """``<tool_call>["q1", "q2"]</tool_call>`` or ``<answer>["A", "B"]</answer>`` (SPADER)."""

    name = "spader"
    tag = "tool_response"
    call_names = ("search",)

    def __init__(self, max_queries: int = MAX_QUERIES_PER_CALL):
        self.max_queries = max(1, int(max_queries))

    @staticmethod
    def _block_queries(block: str) -> tuple[list[str] | None, str | None]:
        qs, err = parse_json_list_of_strings(block)
        if qs is not None:
            return qs, None
        try:  # legacy {"name": "search", "arguments": {"query_list": [...]}}
            obj = json.loads(block.strip())
        except (ValueError, RecursionError):
            return None, err
        if isinstance(obj, dict):
            args = obj.get("arguments", obj)
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except (ValueError, RecursionError):
                    args = {}
            if isinstance(args, dict):
                ql = args.get("query_list", args.get("queries", args.get("query")))
                if isinstance(ql, str):
                    ql = [ql]
                if isinstance(ql, list) and all(isinstance(q, str) for q in ql):
                    return list(ql), None
        return None, err

    def parse(self, text: str) -> ParsedTurn:
        text = _cut(text)
        blocks, unclosed = _blocks(text, "tool_call")
        if not blocks:
            if unclosed:
                return ParsedTurn("invalid", error="unclosed <tool_call> tag")
            return ParsedTurn("answer", answer=extract_answer(text))
        n_queries = 0
        parsed = []
        for b in blocks:
            qs, err = self._block_queries(b)
            n_queries += 1 if qs is None else len(qs)
            parsed.append((qs, err))
        qs, err = parsed[-1]
        notes = ["only the last <tool_call> block was executed"] if len(blocks) > 1 else []
        if qs is None:
            return ParsedTurn("invalid", error=f"tool call {err}; write <tool_call>[\"query\"]</tool_call>",
                              num_queries=n_queries, notes=notes)
        qs = _clean_queries(qs)
        if not qs:
            return ParsedTurn("invalid", error="empty query list", num_queries=n_queries, notes=notes)
        if len(qs) > self.max_queries:
            notes.append(f"only the first {self.max_queries} queries were run")
            qs = qs[: self.max_queries]
        return ParsedTurn("tool", calls=[ToolCall("search", {"queries": qs})], num_queries=n_queries,
                          notes=notes)
