"""Shared pieces of the tool-call parsers: limits, :class:`ToolCall` / :class:`ParsedTurn`, the
linear-time tag scanners, answer extraction and the think-format check."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

# Model output longer than this is cut before parsing. Every parser is linear time on the cut text:
# tags and fences are found with str.find and single forward scans; the only regexes left
# (``\(?:boxed|fbox)\s*\{``, ``</?think>``) have one quantifier each, over runs that different
# match attempts cannot share, so they cannot backtrack quadratically.
MAX_PARSE_CHARS = 200_000
# A single query longer than this is cut (BM25 over a 20k-char query is pointless and slow).
MAX_QUERY_CHARS = 512
# Default caps per turn (configurable per parser / env): tool calls executed in one turn and
# queries run by one search call (the SPADER default of 8 queries per call).
MAX_CALLS_PER_TURN = 4
MAX_QUERIES_PER_CALL = 8
# Model-written text echoed back in an error (an unknown tool name, ...) is cut to this prefix.
MAX_ECHO_CHARS = 64


def echo(text: Any, limit: int = MAX_ECHO_CHARS) -> str:
    """``repr`` of at most ``limit`` characters of model-written text, for error messages."""
    s = text if isinstance(text, str) else str(text)
    if len(s) <= limit:
        return repr(s)
    return repr(s[:limit]) + f"...({len(s)} chars)"


def clip(text: str, limit: int | None, marker: str = "\n...[truncated]") -> str:
    """``text`` cut to at most ``limit`` characters (a marker at the end shows the cut)."""
    if limit is None or len(text) <= limit:
        return text
    if limit <= len(marker):
        return text[: max(limit, 0)]
    return text[: limit - len(marker)] + marker


@dataclass
class ToolCall:
    """One parsed tool call: ``name`` ("search" / "code_interpreter" / "action") and arguments
    (``{"queries": [...]}``, ``{"code": "..."}``, ``{"action": "..."}``)."""

    name: str
    arguments: dict[str, Any]
    error: str | None = None  # hermes: a call that could not be parsed keeps its slot with an error


@dataclass
class ParsedTurn:
    """What one assistant turn asks for.

    kind: ``"tool"`` (``calls`` to execute), ``"answer"`` (final answer, ``answer`` holds the raw
    text inside the answer tag or None if missing), or ``"invalid"`` (``error`` says why; the
    environment shows it and the episode goes on). ``num_queries`` is the per-step query count
    (docs/algorithms.md 3.2). ``notes`` are short remarks appended to the observation.
    """

    kind: str
    calls: list[ToolCall] = field(default_factory=list)
    answer: str | None = None
    error: str | None = None
    num_queries: int = 0
    notes: list[str] = field(default_factory=list)


def _cut(text: Any) -> str:
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    return text[:MAX_PARSE_CHARS]


def _blocks(text: str, tag: str) -> tuple[list[str], bool]:
    """Contents of complete ``<tag>..</tag>`` blocks (non-greedy) and whether an opening tag is
    left unclosed after the last complete block."""
    open_t, close_t = f"<{tag}>", f"</{tag}>"
    out: list[str] = []
    pos = 0
    unclosed = False
    while True:
        i = text.find(open_t, pos)
        if i < 0:
            break
        j = text.find(close_t, i + len(open_t))
        if j < 0:
            unclosed = True
            break
        out.append(text[i + len(open_t) : j])
        pos = j + len(close_t)
    return out, unclosed


def _first_complete(text: str, tags: tuple[str, ...]) -> tuple[str, str] | None:
    """The leftmost complete ``<t>..</t>`` block over several tags (what the regex
    ``<(a|b)>(.*?)</\\1>`` finds), in linear time."""
    best = None
    for t in tags:
        o = text.find(f"<{t}>")
        if o < 0:
            continue
        c = text.find(f"</{t}>", o + len(t) + 2)
        if c >= 0 and (best is None or o < best[0]):
            best = (o, t, text[o + len(t) + 2 : c])
    return None if best is None else (best[1], best[2])


def extract_answer(text: str) -> str | None:
    """Content of the last complete ``<answer>..</answer>`` block (stripped), or None."""
    blocks, _ = _blocks(_cut(text), "answer")
    return blocks[-1].strip() if blocks else None


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` with balanced braces (also ``\\fbox{}``), or None.
    Linear time: braces are matched once with a stack."""
    text = _cut(text)
    starts = [m.end() - 1 for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    if not starts:
        return None
    match: dict[int, int] = {}
    stack: list[int] = []
    for k, c in enumerate(text):
        if c == "{":
            stack.append(k)
        elif c == "}" and stack:
            match[stack.pop()] = k
    for o in reversed(starts):
        if o in match:
            return text[o + 1 : match[o]].strip()
    return None


def begin_turn(env, assistant_text) -> "tuple[str, ParsedTurn] | None":
    """Shared start of a turn for parser-driven envs (search, code).

    Coerces the text to ``str``, counts the turn, records a think-format error in
    ``env.format_errors`` and parses with ``env.parser``. Returns None when the episode is
    already over (the caller answers with a terminal ``StepResult``).
    """
    if env.done:
        return None
    if not isinstance(assistant_text, str):
        assistant_text = "" if assistant_text is None else str(assistant_text)
    env.turns += 1
    fe = check_think_format(assistant_text)
    if fe:
        env.format_errors.append(f"turn {env.turns}: {fe}")
    return assistant_text, env.parser.parse(assistant_text)


def check_think_format(text: str) -> str | None:
    """SPADER's ``check_format_error`` on one turn: nested ``<think>``, a ``</think>`` without an
    opening, or an unclosed ``<think>``. Returns an error message or None."""
    text = _cut(text)
    depth = 0
    for m in re.finditer(r"</?think>", text):
        if m.group(0) == "<think>":
            if depth:
                return "nested <think> tags"
            depth = 1
        else:
            if not depth:
                return "</think> without <think>"
            depth = 0
    if depth:
        return "unclosed <think> tag"
    return None


def parse_json_list_of_strings(payload: str) -> tuple[list[str] | None, str | None]:
    """Parse a JSON list of strings (numbers are converted to strings). Returns (list, None) or
    (None, error)."""
    try:
        val = json.loads(payload.strip())
    except (ValueError, RecursionError) as e:
        return None, f"not valid JSON ({type(e).__name__})"
    if not isinstance(val, list):
        return None, "expected a JSON list of strings"
    out = []
    for v in val:
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            return None, "expected a JSON list of strings"
        out.append(str(v))
    return out, None


def _clean_queries(qs: list[str]) -> list[str]:
    return [q.strip()[:MAX_QUERY_CHARS] for q in qs if q.strip()]
