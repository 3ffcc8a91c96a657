"""The ``retool`` code-tool format: the released SPEAR ReTool recipe's SandboxFusion tool.

``env_config.tool_format: "retool"`` for ``code_math``. Every value below was read from the
released code (TencentYoutuResearch/SPEAR, which vendors verl); docs/tools.md has the table of
released value | ours | file.

Tool (``verl/recipe/spear/sandbox_fusion_tool_config.yaml``): ``default_timeout: 30``,
``memory_limit_mb: 1024``, ``default_language: "python"``; schema ``{"type": "function",
"function": {"name": "code_interpreter", "description": "A tool for executing code.",
"parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "The
code to execute."}}, "required": ["code"]}}}`` (:data:`TOOL_SCHEMA`). verl's tool agent loop
(``verl/experimental/agent_loop/tool_agent_loop.py``) renders the prompt with
``apply_chat_template(messages, tools=tool_schemas, add_generation_prompt=True)``: the model sees
the schema through its chat template's tools block (Qwen2.5: a system message), and the recipe
adds no system message of its own.

Prompt (``verl/recipe/spear/retool.py``): ``answer_format = "\\nThe answer format must be:
\\\\boxed{'The final answer goes here.'}"`` (:data:`ANSWER_FORMAT`; as text: a newline, then
``The answer format must be: \\boxed{'The final answer goes here.'}``), appended to the one user
message: AIME rows (``map_fn``) get ``problem + answer_format``; DAPO-Math-17k rows (``map_fn2``)
get it appended to ``prompt[0]["content"]``, i.e. after DAPO's own instruction text around the
problem. Here: ``prompt_field="prompt"`` (default) appends it to the task's ``prompt`` (the
dataset's user message, as released for both data sets when the AIME loader puts the bare problem
in ``prompt``); ``prompt_field="problem"`` uses the task's bare ``problem`` when it has one.

Calls (``tool_agent_loop.py``, ``tool_parser.py`` ``HermesToolParser``, ``rollout.yaml``
``multi_turn``: ``format: hermes``, ``max_parallel_calls: 1``): a turn holding both
``<tool_call>`` and ``</tool_call>`` has its ``<tool_call>(.*?)</tool_call>`` blocks read as JSON
``{"name": ..., "arguments": ...}``; a block that does not parse (or lacks either key) is dropped.
No valid call: the turn ends the episode (it is the answer turn). Only the first valid call runs.
A call to an unknown tool, or whose arguments are not an object, or whose ``code`` is not a
string, raises in verl and ends the episode too. ``code = arguments.get("code", "")``; then
(``retool.py`` ``CustomSandboxFusionTool.execute``) the first `````python(.*?)````` match, stripped,
replaces it, then the first `````py(.*?)````` match of what is left, stripped. A ``timeout`` or
``language`` argument the model writes is ignored here (released: honoured).

Program (``retool.py`` ``WRAPPER_CODE``): :data:`WRAPPER_CODE` + code, run as one program in a
fresh process (stateless). The wrapper star-imports string, re, datetime, collections, heapq,
bisect, copy, math, random, statistics, itertools, functools, operator, io, sys, json, builtins,
typing, imports those modules by name, and ``import numpy as np``. numpy must import inside the
sandbox: the environment checks it when it is built (``sandbox_imports``).

Result (``verl/tools/sandbox_fusion_tools.py`` ``SandboxFusionTool.execute_code``, with
SandboxFusion's ``run_status`` from ``verl/utils/reward_score/sandbox_fusion/utils.py``):

- the run did not finish (SandboxFusion ``TimeLimitExceeded`` / API or sandbox error): the text is
  ``Tool API failed! Please try again.`` Here: the wall-clock timeout, the CPU-time limit, or a
  failure of the sandbox itself;
- stderr is not empty: its lines, each stripped, empty ones dropped, the last 2 joined by a
  newline, stripped, then ``"\\nErrors occurred! Check your code."`` appended; stdout is dropped;
- else stdout stripped; if stdout was empty, ``"\\nEmpty stdout! You might forget to print the
  answer."`` is appended;
- the whole text is stripped (so an empty stdout reads ``Empty stdout! You might forget to print
  the answer.``).

Any other end of the program (an exception, exit code != 0, a kill for memory, output or disk)
is a finished run and follows the stderr / stdout rules. Tracebacks are printed as for a script
(every frame, source lines), by this interpreter's Python version.

Truncation (``rollout.yaml``: ``max_tool_response_length: 16384``,
``tool_response_truncate_side: middle``; ``tool_agent_loop.py`` ``_call_tool``): a result longer
than 16384 characters becomes ``text[:8192] + "...(truncated)..." + text[-8192:]`` (half =
``limit // 2`` on each side; :func:`truncate_middle`).

Observation: the result text goes back as a ``tool`` role message rendered by the model's chat
template (``tool_agent_loop.py``); use ``observation_template: "chat_template"`` in the sampling
settings (``rllib_spear/env_runners/rollout.py``), which for Qwen2.5 renders
``<|im_start|>user\\n<tool_response>\\n{text}\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n``.
(verl takes that rendering minus the template's default system block and appends it right after
the sampled ``<|im_end|>``, without the ``\\n`` a full rendering has there; ours keeps the ``\\n``.)

Answer (``retool.py`` / ``recipe/spear/reward.py``: ``math_dapo.compute_score(solution_str,
ground_truth, strict_box_verify=True)``, ``verl/utils/reward_score/math_dapo.py``): the last 100
characters of the response (``solution_str[-300:]``, then ``pred[-100:]``); in them the last
``\\boxed{`` with its matching ``}``; its content compared with the ground truth by exact string
equality (no normalisation: ``\\boxed{ 34}``, ``\\boxed{34.0}`` are wrong). Score +1 / -1. This
differs from :func:`~rllib_spear.envs.code_math.math_answers_match` (which strips spaces, ``$``,
``,``, ``\\text{}`` and compares numbers by value) and reads the final turn's text only (the
released response string also holds earlier turns and tool output: it differs when the final turn
is shorter than 100 characters and has no box). A turn cut by ``max_turns`` is scored the same way
(released: the episode's text is scored however it ended). The tool-call bonus of ``reward.py`` is
the algorithm's (``tool_reward_schedule``), not the environment's.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from .code_formats import CodeToolFormat, register_tool_format
from .parsers import ParsedTurn, ToolCall
from .parsers.base import _blocks, _cut
from .sandbox import SandboxResult
from .sandbox.config import _PREIMPORT

__all__ = [
    "WRAPPER_CODE", "ANSWER_FORMAT", "TOOL_SCHEMA", "TOOL_API_FAILED", "ERRORS_OCCURRED", "EMPTY_STDOUT",
    "TRUNCATION_MARKER", "MAX_TOOL_RESPONSE_CHARS", "RETOOL", "ReToolCallParser", "extract_code",
    "result_text", "truncate_middle", "strict_box_answer", "user_text",
]

#: ``retool.py`` ``WRAPPER_CODE``, put before the model's code (same program, same line numbers).
WRAPPER_CODE = """
import traceback
from string import *
from re import *
from datetime import *
from collections import *
from heapq import *
from bisect import *
from copy import *
from math import *
from random import *
from statistics import *
from itertools import *
from functools import *
from operator import *
from io import *
from sys import *
from json import *
from builtins import *
from typing import *
import string
import re
import datetime
import collections
import heapq
import bisect
import copy
import math
import random
import statistics
import itertools
import functools
import operator
import io
import sys
import json
import numpy as np

"""

#: ``retool.py`` ``answer_format``, appended to the user message.
ANSWER_FORMAT = "\nThe answer format must be: \\boxed{'The final answer goes here.'}"

#: ``sandbox_fusion_tool_config.yaml`` ``tool_schema`` (key order as verl's pydantic dump).
TOOL_SCHEMA: Mapping[str, Any] = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "A tool for executing code.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The code to execute."}},
            "required": ["code"],
        },
    },
}

# ``sandbox_fusion_tools.py`` ``execute_code``
TOOL_API_FAILED = "Tool API failed! Please try again."
ERRORS_OCCURRED = "Errors occurred! Check your code."
EMPTY_STDOUT = "Empty stdout! You might forget to print the answer."
# ``rollout.yaml`` ``multi_turn.max_tool_response_length`` / ``tool_agent_loop.py`` (side "middle")
MAX_TOOL_RESPONSE_CHARS = 16384
TRUNCATION_MARKER = "...(truncated)..."
_STDERR_LINES = 2  # the last lines of stderr that are kept
_ANSWER_WINDOW = 100  # ``math_dapo.is_correct_strict_box``: pred[-100:] (of solution_str[-300:])
_BOX = "\\boxed{"


def truncate_middle(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its first and last ``limit // 2``
    characters around :data:`TRUNCATION_MARKER` (verl's ``tool_response_truncate_side:
    middle``)."""
    if len(text) <= limit:
        return text
    half = max(limit, 0) // 2
    return text[:half] + TRUNCATION_MARKER + text[len(text) - half:]


def _finished(res: SandboxResult) -> bool:
    """Whether SandboxFusion would report ``run_status == "Finished"``: the program ended by
    itself (any exit code, an exception, a kill for memory / output / disk), not by a time limit
    and not by a failure of the sandbox."""
    err = res.error or ""
    return not (res.timed_out or "CPU time limit" in err or err.startswith("sandbox failure"))


def result_text(res: SandboxResult, limit: int = MAX_TOOL_RESPONSE_CHARS) -> str:
    """One call's result as the released tool returns it (see the module docstring), cut to
    ``limit`` characters by :func:`truncate_middle`."""
    if not _finished(res):
        msg = TOOL_API_FAILED
    elif res.stderr:
        lines = [line.strip() for line in res.stderr.split("\n") if line.strip()]
        msg = "\n".join(lines[-_STDERR_LINES:]).strip() + "\n" + ERRORS_OCCURRED
    else:
        msg = res.output.strip()
        if not res.output:
            msg += "\n" + EMPTY_STDOUT
    return truncate_middle(msg.strip(), limit)


def _first_fenced(code: str, opener: str) -> str | None:
    """Group 1 of the first match of ``opener(.*?)```"`` (DOTALL), in linear time: the leftmost
    ``opener`` that has a closing fence after it (if it has none, no later one has)."""
    i = code.find(opener)
    if i < 0:
        return None
    j = code.find("```", i + len(opener))
    return None if j < 0 else code[i + len(opener): j]


def extract_code(code: str) -> str:
    """``CustomSandboxFusionTool.execute``: the first ```` ```python ```` block (stripped)
    replaces ``code``, then the first ```` ```py ```` block of the result (stripped)."""
    for opener in ("```python", "```py"):
        inner = _first_fenced(code, opener)
        if inner is not None:
            code = inner.strip()
    return code


class ReToolCallParser:
    """verl's hermes rule for the ReTool tool (module docstring, "Calls"): never ``invalid``;
    a turn whose calls cannot run is the answer turn (``notes`` say why)."""

    name = "retool_hermes"
    tag = "tool_response"
    call_names = ("code_interpreter",)

    def __init__(self, max_calls: int = 1):
        self.max_calls = max(1, int(max_calls))

    def parse(self, text: str) -> ParsedTurn:
        text = _cut(text)
        if "<tool_call>" not in text or "</tool_call>" not in text:
            return ParsedTurn("answer")
        blocks, _ = _blocks(text, "tool_call")
        valid, notes = [], []
        for b in blocks:
            try:
                obj = json.loads(b)
                name, args = obj["name"], obj["arguments"]
            except (ValueError, RecursionError, KeyError, TypeError, IndexError):
                notes.append("a <tool_call> that is not JSON with 'name' and 'arguments' was dropped")
                continue
            if not isinstance(name, str):  # verl's FunctionCall(name: str) rejects it
                notes.append("a <tool_call> whose name is not a string was dropped")
                continue
            valid.append((name, args))
        notes = list(dict.fromkeys(notes))  # one note per kind, however many blocks were dropped
        if not valid:
            return ParsedTurn("answer", notes=notes or ["no valid <tool_call>"])
        calls = []
        for name, args in valid[: self.max_calls]:
            if name != "code_interpreter":
                return ParsedTurn("answer", notes=[f"call to unknown tool {name[:64]!r} ends the episode"])
            if not isinstance(args, dict):
                return ParsedTurn("answer", notes=["call arguments are not an object; the episode ends"])
            code = args.get("code", "")
            if not isinstance(code, str):
                return ParsedTurn("answer", notes=["argument 'code' is not a string; the episode ends"])
            calls.append(ToolCall("code_interpreter", {"code": extract_code(code)}))
        return ParsedTurn("tool", calls=calls, num_queries=len(calls))


def _prompt_text(task: Mapping[str, Any]) -> str:
    p = task.get("prompt")
    if isinstance(p, (list, tuple)):  # a raw chat list: its last user message
        users = [m.get("content") for m in p if isinstance(m, dict) and m.get("role") == "user"]
        p = users[-1] if users else None
    if not isinstance(p, str) or not p.strip():
        raise ValueError(f"code_math task needs a non-empty 'prompt' (str or chat list), got {p!r:.80}")
    return p


def user_text(task: Mapping[str, Any], prompt_field: str = "prompt") -> str:
    """The user message: the task's ``prompt`` (or, with ``prompt_field="problem"``, its bare
    ``problem`` when present) followed by :data:`ANSWER_FORMAT`."""
    problem = task.get("problem") if prompt_field == "problem" else None
    base = problem if isinstance(problem, str) and problem.strip() else _prompt_text(task)
    return base + ANSWER_FORMAT


def strict_box_answer(text: str, gold: str) -> tuple[str | None, bool]:
    """``math_dapo`` with ``strict_box_verify=True``: the content of the last ``\\boxed{..}`` in
    the last 100 characters (braces balanced), correct iff it equals ``gold`` exactly."""
    window = text[-_ANSWER_WINDOW:]
    start = window.rfind(_BOX)
    if start < 0:
        return None, False
    depth = 0
    for k in range(start + len(_BOX) - 1, len(window)):
        if window[k] == "{":
            depth += 1
        elif window[k] == "}":
            depth -= 1
            if depth == 0:
                pred = window[start + len(_BOX): k]
                return pred, pred == gold
    return None, False


RETOOL = register_tool_format(CodeToolFormat(
    name="retool",
    # SandboxFusion: 30 s (run and compile), 1024 MB. The CPU limit equals the wall limit (the
    # released tool has only the one timeout). stderr is read apart (the result rule needs it);
    # numpy is pre-imported for the weak backends, which drop privileges after their imports.
    sandbox={"wall_timeout_s": 30.0, "cpu_time_s": 30, "memory_mb": 1024, "preamble": "",
             "separate_stderr": True, "script_tracebacks": True, "preimport": [*_PREIMPORT, "numpy"]},
    max_obs_chars=MAX_TOOL_RESPONSE_CHARS,
    max_calls_per_turn=1,
    system_prompts=None,
    user_text=user_text,
    result_text=result_text,
    answer=strict_box_answer,
    parser=ReToolCallParser,
    code_prefix=WRAPPER_CODE,
    tag_results=False,
    score_truncated=True,
    tool_schemas=(TOOL_SCHEMA,),
    sandbox_imports=("numpy",),
    prompt_fields=("prompt", "problem"),
))
