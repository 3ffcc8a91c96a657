"""The ReTool ``code`` parser and the linear-time Markdown fence scanner it shares with hermes."""
from __future__ import annotations

from .base import ParsedTurn, ToolCall, _blocks, _cut, extract_boxed
from .registry import register_parser

__all__ = ["CodeParser"]

_LANGS_PY = ("python3", "python", "py")
_LANGS_ANY = _LANGS_PY + ("",)


def _skip_blanks(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in " \t":
        i += 1
    return i


def _fence_open_end(text: str, i: int, langs: tuple[str, ...]) -> int:
    r"""End of a fence opener ```` ```[ \t]*(lang)?[ \t]*\n ```` starting at ``i`` (where
    ```` ``` ```` is), or -1. A deterministic scan with the same result as the regex (the first
    language that is followed by blanks and a newline wins); no backtracking."""
    a = _skip_blanks(text, i + 3)
    for lang in langs:
        if lang and not text.startswith(lang, a):
            continue
        c = _skip_blanks(text, a + len(lang))
        if c < len(text) and text[c] == "\n":
            return c + 1
    return -1


def _fences(text: str, langs: tuple[str, ...]) -> tuple[list[str], bool]:
    r"""Code inside fences opened by ```` ```lang\n ```` (``langs``, "" = no language) and closed
    by ```` ``` ````; also whether a fence is left unclosed. Linear time: the blank runs scanned
    after different ```` ``` ```` starts are disjoint, and every closing search starts past the
    previous one."""
    out, pos = [], 0
    while True:
        i = text.find("```", pos)
        if i < 0:
            return out, False
        end = _fence_open_end(text, i, langs)
        if end < 0:
            pos = i + 1
            continue
        j = text.find("```", end)
        if j < 0:
            return out, True
        out.append(text[end:j])
        pos = j + 3


def _strip_fence(code: str) -> str:
    """The code of the first fenced block in ``code`` (any or no language), else ``code``."""
    blocks, _ = _fences(code, _LANGS_ANY)
    return blocks[0] if blocks else code


@register_parser("code")
class CodeParser:
    """ReTool code blocks: ``<code>```python ...```</code>`` or a bare ```` ```python ```` fence."""

    name = "code"
    tag = "interpreter"
    call_names = ("code_interpreter",)

    def parse(self, text: str) -> ParsedTurn:
        text = _cut(text)
        blocks, unclosed = _blocks(text, "code")
        if len(blocks) > 1:
            return ParsedTurn("invalid", error="only one code block per turn", num_queries=len(blocks))
        if blocks:
            codes = [_strip_fence(b) for b in blocks]
        else:
            if unclosed:
                return ParsedTurn("invalid", error="unclosed <code> tag")
            codes, fence_open = _fences(text, _LANGS_PY)
            if not codes and fence_open:
                return ParsedTurn("invalid", error="unclosed ```python fence")
        if not codes:
            return ParsedTurn("answer", answer=extract_boxed(text))
        if len(codes) > 1:
            return ParsedTurn("invalid", error="only one code block per turn", num_queries=len(codes))
        if not codes[0].strip():
            return ParsedTurn("invalid", error="empty code block", num_queries=1)
        return ParsedTurn("tool", calls=[ToolCall("code_interpreter", {"code": codes[0]})], num_queries=1)
