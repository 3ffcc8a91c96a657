"""Plain Python functions as tools (the TRL / verl style): :class:`FunctionToolEnv`.

::

    def lookup(city: str) -> str:
        \"\"\"Facts about a city.

        Args:
            city: the city's name
        \"\"\"
        return TABLE[city]          # an exception here becomes the observation, not a crash

    env = FunctionToolEnv(tools=[lookup], max_turns=3)
    env.reset({"question": "Where is Veloria?", "answer": "the coast"})

The system prompt lists every tool as a JSON schema (``transformers.utils.get_json_schema`` from
the type hints and the Google-style docstring; a function it cannot describe gets a schema from its
signature alone) inside ``<tools></tools>``, in the Hermes / Qwen format. The model calls tools
with ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (several blocks per turn are
parallel calls, at most ``max_calls_per_turn`` of them run); each result comes back in its own
``<tool_response>..</tool_response>``, cut to ``max_observation_chars``. A result that is not a
string is JSON-encoded. A malformed call, an unknown tool, arguments the function does not take or
an exception raised by the function become an error observation and the episode goes on.

The episode ends on ``<answer>..</answer>`` (a turn without a ``<tool_call>``) or after
``max_turns`` turns. The answer is scored by ``reward_fn(task, answer) -> float`` (default: exact
match of the normalised answer against ``task["answer"]`` or ``task["golden_answers"]``);
``success`` is ``score >= success_threshold``. Tasks are dicts with ``question`` (or ``prompt``, or
the key named by ``question_key``).

Tools run synchronously in the env runner's process: keep them fast, or bound them yourself.
"""
from __future__ import annotations

import collections.abc
import inspect
import json
import types
import typing
from typing import Any, Callable, Mapping, Sequence

from ..core.answers import exact_match, normalize_answer
from ..core.episode import EpisodeStats
from .base import StepResult, ToolEnv
from .parsers import (MAX_CALLS_PER_TURN, ParsedTurn, ToolCall, _blocks, _cut, check_think_format, clip, echo,
                      extract_answer)

__all__ = ["FunctionToolEnv", "function_schema", "default_answer_reward", "TOOLS_PROMPT"]

TOOLS_PROMPT = """You are a helpful assistant. You may call one or more functions to answer the user's question.

# Tools

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call>
The results come back within <tool_response></tool_response> tags. When you know the answer, reply with <answer>your answer</answer>."""

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", tuple: "array",
               dict: "object", type(None): "null"}


def _hint_schema(hint: Any) -> dict[str, Any]:
    """A JSON schema of a type hint (the common cases; anything else: no constraint)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        subs = [_hint_schema(a) for a in args]
        names = [s["type"] for s in subs if "type" in s and len(s) == 1]
        return {"type": names} if len(names) == len(subs) else {}
    if origin in (list, tuple, set, frozenset, collections.abc.Sequence):
        out: dict[str, Any] = {"type": "array"}
        if args and args[-1] is not Ellipsis:
            out["items"] = _hint_schema(args[0])
        return out
    if origin in (dict, collections.abc.Mapping):
        return {"type": "object"}
    return {}


def _signature_schema(fn: Callable[..., Any], name: str) -> dict[str, Any]:
    doc = inspect.getdoc(fn) or ""
    description = doc.split("\n\n", 1)[0].strip()
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolvable annotations: describe without types
        hints = {}
    props, required = {}, []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        props[p.name] = _hint_schema(hints.get(p.name, inspect.Parameter.empty))
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
    params: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        params["required"] = required
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


def function_schema(fn: Callable[..., Any], name: str | None = None) -> dict[str, Any]:
    """The tool schema of ``fn`` (``{"type": "function", "function": {name, description,
    parameters}}``): ``transformers.utils.get_json_schema`` when it can describe ``fn`` (type
    hints and a Google-style ``Args:`` docstring), else one built from the signature and hints."""
    name = name or fn.__name__
    try:
        from transformers.utils import get_json_schema

        schema = get_json_schema(fn)
        schema["function"]["name"] = name
        return schema
    except Exception:  # noqa: BLE001 - no docstring / hints / transformers: describe from the signature
        return _signature_schema(fn, name)


def _golds(task: Mapping[str, Any]) -> list[str]:
    gold = task.get("answer", task.get("golden_answers"))
    if gold is None:
        return []
    if isinstance(gold, (list, tuple)):
        return [str(g) for g in gold]
    return [str(gold)]


def default_answer_reward(task: Mapping[str, Any], answer: str) -> float:
    """1.0 when the normalised answer equals a normalised ``task["answer"]`` (a string or a list
    of accepted strings) or one of ``task["golden_answers"]``, else 0.0."""
    return exact_match(answer, _golds(task))


class FunctionToolEnv(ToolEnv):
    """A tool environment whose tools are plain Python functions (see module docstring).

    Args:
        tools: the functions (their ``__name__`` is the tool name; names must be unique).
        reward_fn: ``reward_fn(task, answer) -> float`` scoring the final answer (default
            :func:`default_answer_reward`).
        system_prompt: None = :data:`TOOLS_PROMPT`; a string with ``{tools}`` gets the tool
            schemas there; any other string is followed by the tools block and call format.
        max_turns: assistant turns per episode (the last one should answer).
        max_calls_per_turn: tool calls run per turn (more are reported, not run).
        max_observation_chars: most characters of one tool result (longer ones are cut).
        success_threshold: ``success`` = answer score >= this.
        question_key: the task key holding the question (default ``question``, then ``prompt``).
    """

    def __init__(self, tools: Sequence[Callable[..., Any]] = (), reward_fn: Callable[..., float] | None = None,
                 system_prompt: str | None = None, max_turns: int = 4, *,
                 max_calls_per_turn: int = MAX_CALLS_PER_TURN, max_observation_chars: int = 2000,
                 success_threshold: float = 1.0, question_key: str | None = None):
        self.tools: dict[str, Callable[..., Any]] = {}
        for fn in tools:
            if not callable(fn):
                raise TypeError(f"FunctionToolEnv: tool {fn!r:.60} is not callable")
            name = getattr(fn, "__name__", type(fn).__name__)
            if name in self.tools:
                raise ValueError(f"FunctionToolEnv: two tools named {name!r}")
            self.tools[name] = fn
        if not self.tools:
            raise ValueError("FunctionToolEnv needs at least one tool function (tools=[fn, ...])")
        if int(max_turns) < 1 or int(max_calls_per_turn) < 1 or int(max_observation_chars) < 16:
            raise ValueError("FunctionToolEnv: max_turns and max_calls_per_turn must be >= 1 and "
                             f"max_observation_chars >= 16, got {max_turns}, {max_calls_per_turn}, "
                             f"{max_observation_chars}")
        self.reward_fn = reward_fn or default_answer_reward
        self.max_turns = int(max_turns)
        self.max_calls_per_turn = int(max_calls_per_turn)
        self.max_observation_chars = int(max_observation_chars)
        self.success_threshold = float(success_threshold)
        self.question_key = question_key
        self.schemas = [function_schema(fn, name) for name, fn in self.tools.items()]
        self._signatures = {name: _signature_or_none(fn) for name, fn in self.tools.items()}
        self._system_prompt = self._build_prompt(system_prompt)
        self.task: dict[str, Any] = {}
        self._new_episode()
        self.done = True

    # -- prompt --------------------------------------------------------------------------------
    def _build_prompt(self, custom: str | None) -> str:
        block = "\n".join(json.dumps(s, ensure_ascii=False) for s in self.schemas)
        if custom is None:
            return TOOLS_PROMPT.replace("{tools}", block)
        if "{tools}" in custom:
            return custom.replace("{tools}", block)
        tail = TOOLS_PROMPT.split("\n\n", 1)[1].replace("{tools}", block)
        return f"{custom}\n\n{tail}"

    @property
    def system_prompt(self) -> str:
        return self._system_prompt

    def _question(self, task: Mapping[str, Any]) -> str:
        keys = (self.question_key,) if self.question_key else ("question", "prompt")
        for k in keys:
            if isinstance(task.get(k), str):
                return task[k]
        raise KeyError(f"FunctionToolEnv: task has no string {' or '.join(map(repr, keys))} "
                       f"(keys: {sorted(task)})")

    # -- episode -------------------------------------------------------------------------------
    def _new_episode(self) -> None:
        self.turns = 0
        self.tool_calls = 0
        self.tool_errors = 0
        self.calls_by_tool: dict[str, int] = {}
        self.queries_per_step: list[int] = []
        self.format_errors: list[str] = []
        self.answer: str | None = None
        self.score = 0.0
        self.truncated = False

    def reset(self, task: dict[str, Any]) -> list[dict[str, str]]:
        question = self._question(task)
        self._new_episode()
        self.task = task
        self.done = False
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": question}]

    def step(self, assistant_text: str) -> StepResult:
        if self.done:
            return StepResult(None, 0.0, True, {"error": "episode is over; call reset()"})
        text = _cut(assistant_text if isinstance(assistant_text, str) else str(assistant_text or ""))
        self.turns += 1
        fe = check_think_format(text)
        if fe:
            self.format_errors.append(f"turn {self.turns}: {fe}")
        turn = self.parse(text)
        info: dict[str, Any] = {"action": turn.kind}
        if turn.kind == "answer":
            self.queries_per_step.append(0)
            return self._finish(turn.answer, info)
        self.queries_per_step.append(turn.num_queries)
        if self.turns >= self.max_turns:
            self.truncated = info["truncated"] = True
            return self._finish(None, info)
        if turn.kind == "invalid":
            self.format_errors.append(f"turn {self.turns}: {turn.error}")
            self.tool_errors += 1
            info["error"] = turn.error
            return StepResult(self._wrap(f"Error: {turn.error}"), 0.0, False, info)
        return StepResult(self._run(turn), 0.0, False, info)

    def parse(self, text: str) -> ParsedTurn:
        """The turn as :class:`~rllib_spear.envs.parsers.ParsedTurn`: ``tool`` (its ``calls``:
        ``ToolCall(name, arguments)``, or ``error`` for a block that is not a valid call),
        ``answer`` or ``invalid``. Never raises."""
        blocks, unclosed = _blocks(text, "tool_call")
        if not blocks:
            if unclosed:
                return ParsedTurn("invalid", error="unclosed <tool_call> tag")
            return ParsedTurn("answer", answer=extract_answer(text))
        turn = ParsedTurn("tool", num_queries=len(blocks))
        if len(blocks) > self.max_calls_per_turn:
            turn.notes.append(f"only the first {self.max_calls_per_turn} of {len(blocks)} tool calls were run")
        turn.calls = [self._call(b) for b in blocks[: self.max_calls_per_turn]]
        return turn

    def _call(self, block: str) -> ToolCall:
        try:
            obj = json.loads(block.strip())
        except (ValueError, RecursionError) as e:
            return ToolCall("error", {}, error=f"tool call is not valid JSON ({type(e).__name__})")
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return ToolCall("error", {}, error='expected {"name": ..., "arguments": {...}}')
        name, args = obj["name"], obj.get("arguments", {})
        if name not in self.tools:
            return ToolCall("error", {}, error=f"unknown tool {echo(name)}; available: {sorted(self.tools)}")
        if isinstance(args, str):  # some models send the arguments as a JSON string
            try:
                args = json.loads(args) if args.strip() else {}
            except (ValueError, RecursionError):
                args = None
        if not isinstance(args, dict):
            return ToolCall(name, {}, error=f"arguments of {name!r} must be a JSON object")
        sig = self._signatures[name]
        if sig is not None:
            try:
                sig.bind(**args)
            except TypeError as e:
                return ToolCall(name, args, error=f"bad arguments for {name!r}: {clip(str(e), 200)}")
        return ToolCall(name, args)

    def _wrap(self, text: str) -> str:
        return f"<tool_response>\n{clip(text, self.max_observation_chars)}\n</tool_response>"

    def _run(self, turn: ParsedTurn) -> str:
        parts = []
        for call in turn.calls:
            if call.error:
                self.tool_errors += 1
                self.format_errors.append(f"turn {self.turns}: {call.error}")
                parts.append(self._wrap(f"Error: {call.error}"))
                continue
            self.tool_calls += 1
            self.calls_by_tool[call.name] = self.calls_by_tool.get(call.name, 0) + 1
            try:
                result = self.tools[call.name](**call.arguments)
            except Exception as e:  # noqa: BLE001 - a failing tool is an observation, never a crash
                self.tool_errors += 1
                parts.append(self._wrap(f"Error: {call.name} raised {type(e).__name__}: {clip(str(e), 500)}"))
                continue
            parts.append(self._wrap(_to_text(result, self.max_observation_chars)))
        if turn.notes:
            parts.append("Note: " + "; ".join(turn.notes))
        return "\n".join(parts)

    def _finish(self, answer: str | None, info: dict[str, Any]) -> StepResult:
        self.done = True
        self.answer = answer
        if answer is None:
            info.setdefault("error", "no <answer>")
            self.score = 0.0
        else:
            self.score = float(self.reward_fn(self.task, answer))
        info["score"] = self.score
        return StepResult(None, self.score, True, info)

    def episode_stats(self) -> EpisodeStats:
        has_answer = self.answer is not None
        em = None
        if self.reward_fn is default_answer_reward:
            em = self.score
        return EpisodeStats(
            success=has_answer and self.score >= self.success_threshold,
            outcome_reward=self.score,
            tool_calls=self.tool_calls,
            queries_per_step=list(self.queries_per_step),
            format_ok=has_answer and not self.format_errors,
            has_answer=has_answer,
            em=em,
            extra={"answer": self.answer, "normalized_answer": normalize_answer(self.answer) if has_answer else None,
                   "tool_errors": self.tool_errors, "calls_by_tool": dict(self.calls_by_tool),
                   "turns": self.turns, "truncated": self.truncated, "format_errors": list(self.format_errors)},
        )


def _signature_or_none(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _to_text(result: Any, limit: int) -> str:
    if isinstance(result, str):
        return result
    try:
        text = json.dumps(result, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        text = str(result)
    return clip(text, limit)
