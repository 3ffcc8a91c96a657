"""Tool-call parsers and answer extraction for assistant turns.

Every parser takes one decoded assistant turn and returns a :class:`ParsedTurn`; it never raises on
model output (malformed input becomes ``kind="invalid"`` with an ``error`` the environment shows to
the model). Parsers are chosen by name (``parser=...`` in ``make_env`` / ``env_config``) from a
registry: :func:`get_parser`, :func:`parser_names`, and :func:`register_parser` to add one (see
:mod:`rllib_spear.envs.parsers.registry`). The built-in formats:

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
``action``     text games: ``<action>..</action>`` -> ``<observation>..</observation>``.

Answer extraction: :func:`extract_answer` (last ``<answer>..</answer>``) and :func:`extract_boxed`
(last ``\\boxed{..}``, braces matched).

Modules: ``base`` (limits, data classes, scanners, answer extraction), ``registry``, ``search``
(search_r1, spader), ``hermes``, ``code`` (code parser and fence scanner), ``action``.
"""
from __future__ import annotations

from .base import (  # noqa: F401 - private helpers stay importable from here
    MAX_CALLS_PER_TURN,
    MAX_ECHO_CHARS,
    MAX_PARSE_CHARS,
    MAX_QUERIES_PER_CALL,
    MAX_QUERY_CHARS,
    ParsedTurn,
    ToolCall,
    _blocks,
    _clean_queries,
    _cut,
    _first_complete,
    begin_turn,
    check_think_format,
    clip,
    echo,
    extract_answer,
    extract_boxed,
    parse_json_list_of_strings,
)
from .registry import PARSER_REGISTRY, PARSERS, get_parser, make_parser, parser_names, register_parser

# The built-in parsers register themselves on import, in this order.
from .search import SearchR1Parser, SpaderParser  # noqa: E402  (isort: skip)
from .hermes import HermesParser  # noqa: E402
from .code import (  # noqa: E402,F401
    _LANGS_ANY,
    _LANGS_PY,
    CodeParser,
    _fence_open_end,
    _fences,
    _skip_blanks,
    _strip_fence,
)
from .action import ActionParser  # noqa: E402

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
    "register_parser",
    "get_parser",
    "parser_names",
    "make_parser",
    "PARSERS",
    "PARSER_REGISTRY",
    "MAX_PARSE_CHARS",
    "MAX_CALLS_PER_TURN",
    "MAX_QUERIES_PER_CALL",
    "MAX_ECHO_CHARS",
    "echo",
    "clip",
]
