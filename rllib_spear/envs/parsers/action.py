"""The ``action`` parser of the text games: ``<action>go to kitchen</action>``."""
from __future__ import annotations

from .base import MAX_QUERY_CHARS, ParsedTurn, ToolCall, _blocks, _cut
from .registry import register_parser

__all__ = ["ActionParser"]


@register_parser("action")
class ActionParser:
    """Text games: ``<action>go to kitchen</action>`` (verl-agent ALFWorld/WebShop)."""

    name = "action"
    tag = "observation"
    call_names = ("action",)

    def parse(self, text: str) -> ParsedTurn:
        text = _cut(text)
        blocks, unclosed = _blocks(text, "action")
        if not blocks:
            return ParsedTurn("invalid", error="unclosed <action> tag" if unclosed else
                              "no action; write <action>one admissible action</action>")
        if len(blocks) > 1:
            return ParsedTurn("invalid", error="only one <action> per turn", num_queries=len(blocks))
        act = " ".join(blocks[0].split())[:MAX_QUERY_CHARS]
        if not act:
            return ParsedTurn("invalid", error="empty action", num_queries=1)
        return ParsedTurn("tool", calls=[ToolCall("action", {"action": act})], num_queries=1)
