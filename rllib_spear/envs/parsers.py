"""Tool-call parsers and answer extraction for assistant turns.

Every parser takes one decoded assistant turn and returns a :class:`ParsedTurn`; it never raises on
model output (malformed input becomes ``kind="invalid"`` with an ``error`` the environment shows to
the model). Four formats, chosen by config (``parser=...`` in ``make_env``):

``search_r1``  ``<search>q</search>`` -> ``<information>..</information>``; the first complete
               ``<search>``/``<answer>`` pair decides the action (Search-R1's regex); two or more
               ``<search>`` blocks in one turn are an error.
``spader``     ``<tool_call>["q1", "q2"]</tool_call>`` -> ``<tool_response>..</tool_response>``; only
               the **last** block is executed (released SPADER code); the legacy
               ``{"name": "search", "arguments": {"query_list": [...]}}`` form is accepted. Queries are
               counted over every block of the turn (a block that is not valid JSON counts as 1,
               docs/algorithms.md 3.2). A turn with no ``<tool_call>`` is the answer step.
``hermes``     Qwen/hermes ``<tool_call>{"name": .., "arguments": {..}}</tool_call>``; several blocks
               are parallel calls (up to ``max_calls``), each answered by its own ``<tool_response>``.
``code``       ReTool ``<code>```python ...```</code>`` or a bare ```` ```python ```` fence ->
               ``<interpreter>..</interpreter>``; one code block per turn.

Answer extraction: :func:`extract_answer` (last ``<answer>..</answer>``) and :func:`extract_boxed`
(last ``\\boxed{..}``, braces matched).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ToolCall",
    "ParsedTurn",
    "extract_answer",
    "extract_boxed",
    "begin_turn",
    "check_think_format",
    "parse_json_list_of_strings",
    "SearchR1Parser",
    "SpaderParser",
    "HermesParser",
    "CodeParser",
    "ActionParser",
    "make_parser",
    "PARSERS",
    "MAX_PARSE_CHARS",
    "MAX_CALLS_PER_TURN",
    "MAX_QUERIES_PER_CALL",
    "MAX_ECHO_CHARS",
    "echo",
    "clip",
]

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


class SearchR1Parser:
    """``<search>query</search>`` or ``<answer>..</answer>`` (Search-R1)."""

    name = "search_r1"
    tag = "information"

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


class SpaderParser:
    """``<tool_call>["q1", "q2"]</tool_call>`` or ``<answer>["A", "B"]</answer>`` (SPADER)."""

    name = "spader"
    tag = "tool_response"

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


class CodeParser:
    """ReTool code blocks: ``<code>```python ...```</code>`` or a bare ```` ```python ```` fence."""

    name = "code"
    tag = "interpreter"

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


class ActionParser:
    """Text games: ``<action>go to kitchen</action>`` (verl-agent ALFWorld/WebShop)."""

    name = "action"
    tag = "observation"

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


PARSERS = {
    "search_r1": SearchR1Parser,
    "spader": SpaderParser,
    "hermes": HermesParser,
    "code": CodeParser,
    "action": ActionParser,
}


def make_parser(name: str, **kwargs):
    try:
        cls = PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown parser {name!r}; choose from {sorted(PARSERS)}") from None
    return cls(**kwargs)
