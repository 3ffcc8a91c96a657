"""``code_math``: ReTool-style math with a sandboxed Python interpreter.

The assistant writes code as ``<code>```python ...```</code>`` (or a bare ```` ```python ````
fence; parser ``code``) or as a hermes call ``<tool_call>{"name": "code_interpreter",
"arguments": {"code": "..."}}</tool_call>`` (parser ``hermes``). The code runs in
:class:`~rllib_spear.envs.sandbox.PythonSandbox` (a fresh process per call; see that module for
the isolation and what remains without bubblewrap) and its stdout/stderr come back as
``<interpreter>...</interpreter>`` (``<tool_response>`` for hermes), cut to ``max_obs_chars``.
A turn without code is the answer turn: reward +1 if the last ``\\boxed{}`` equals the ground
truth (numbers compared exactly after removing ``,``/spaces/``$``/``\\text{}``), else -1
(DAPO ``math_dapo``, strict box); a missing box is -1 with ``has_answer=False``.

Interpreter state persists across turns only when the task says so (``task["stateful"]`` true) or
``stateful=True`` is configured: then earlier successful cells are replayed silently before the
new one.

What is above is the ``default`` tool format. ``tool_format`` (env_config) picks another
:class:`~rllib_spear.envs.code_formats.CodeToolFormat` (limits, prelude, result text, prompt,
call rule, answer check): ``"retool"`` is the released SPEAR ReTool recipe's SandboxFusion tool
(:mod:`rllib_spear.envs.retool_format`, docs/tools.md).
"""
from __future__ import annotations

import re
import sys
from fractions import Fraction
from typing import Any

from rllib_spear.core.episode import EpisodeStats
from rllib_spear.envs.base import StepResult, ToolEnv
from rllib_spear.envs.code_formats import CodeToolFormat, get_tool_format, register_tool_format
from rllib_spear.envs.parsers import MAX_CALLS_PER_TURN, begin_turn, clip, extract_boxed, get_parser
from rllib_spear.envs.sandbox import PythonSandbox, SandboxConfig, SandboxResult

__all__ = ["CodeMathEnv", "math_answers_match", "CODE_PROMPTS", "DEFAULT_FORMAT"]

CODE_PROMPTS = {
    "code": (
        "Solve the problem. Think inside <think>...</think>. To run Python, write "
        "<code>```python\n...\n```</code>; its printed output comes back in <interpreter>...</interpreter>. "
        "Give the final answer as \\boxed{answer}."
    ),
    "hermes": (
        "Solve the problem. Think inside <think>...</think>. To run Python, write "
        '<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(1+1)"}}</tool_call>; its output '
        "comes back in <tool_response>...</tool_response>. Give the final answer as \\boxed{answer}."
    ),
}

_SANDBOXES: dict[tuple, PythonSandbox] = {}
_IMPORTS_OK: set[tuple] = set()  # (sandbox key, modules) already checked importable
# Room outside ``max_obs_chars`` for tags, the truncation remark and error text: an observation is
# never longer than ``max_obs_chars + OBS_SLACK_CHARS`` (``obs_budget``).
OBS_SLACK_CHARS = 1024
_ERROR_CHARS = 300  # an interpreter / parser error line is cut to this


def _normalize_math(s: str) -> str:
    s = str(s).strip()
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\(?:left|right|,|!|;|quad)", "", s)
    s = s.replace("$", "").replace(",", "").replace(" ", "").replace("\\dfrac", "\\frac")
    s = s.rstrip(".")
    return s


def _to_number(s: str) -> Fraction | None:
    m = re.fullmatch(r"\\frac\{(-?\d+)\}\{(-?\d+)\}", s)
    try:
        if m:
            return Fraction(int(m.group(1)), int(m.group(2)))
        if re.fullmatch(r"-?\d+(?:\.\d+)?(?:/\d+)?", s):
            return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def math_answers_match(pred: str | None, gold: str) -> bool:
    """Exact match after light normalisation; numbers (ints, decimals, a/b, \\frac{a}{b})
    compare by value."""
    if pred is None:
        return False
    p, g = _normalize_math(pred), _normalize_math(gold)
    if p == g:
        return True
    pn, gn = _to_number(p), _to_number(g)
    return pn is not None and gn is not None and pn == gn


def default_result_text(res: SandboxResult, limit: int) -> str:
    """The ``default`` format's result: merged stdout+stderr cut to ``limit`` characters (head),
    the sandbox's error line, or a hint when nothing was printed."""
    out = res.output or ""
    if len(out) > limit:
        out = out[:limit] + f"\n...[output truncated, {len(res.output)} chars in total]"
    if res.error:
        out = (out + "\n" if out else "") + clip(f"Error: {res.error}", _ERROR_CHARS)
    if not out.strip():
        out = "(no output; use print() to see values)"
    return out


def _task_prompt(task: dict[str, Any], prompt_field: str) -> str:
    return str(task["prompt"])


def _boxed_answer(text: str, gold: str) -> tuple[str | None, bool]:
    pred = extract_boxed(text)
    return pred, math_answers_match(pred, gold)


DEFAULT_FORMAT = register_tool_format(CodeToolFormat(
    name="default",
    sandbox={"wall_timeout_s": 10.0, "cpu_time_s": 5},
    max_obs_chars=1000,
    max_calls_per_turn=MAX_CALLS_PER_TURN,
    system_prompts=CODE_PROMPTS,
    user_text=_task_prompt,
    result_text=default_result_text,
    answer=_boxed_answer,
))


def _sandbox_key(cfg: SandboxConfig) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in vars(cfg).items()))


class CodeMathEnv(ToolEnv):
    """Task keys: ``prompt`` (problem text), ``answer`` (ground truth); optional ``stateful``
    (and ``problem``, the bare problem, read by ``prompt_field="problem"``).

    ``tool_format``: a registered :class:`~rllib_spear.envs.code_formats.CodeToolFormat` name
    (``"default"``, ``"retool"``); it supplies the defaults of ``parser``, ``max_obs_chars``,
    ``max_calls_per_turn``, the sandbox limits (``sandbox_config`` overrides them field by field)
    and the system prompt (``system_prompt`` overrides it). ``prompt_field``: which task text the
    user message is built from, among the format's ``prompt_fields``.
    """

    def __init__(self, *, parser: str | None = None, max_turns: int = 4, max_obs_chars: int | None = None,
                 stateful: bool = False, sandbox: PythonSandbox | None = None,
                 sandbox_config: dict | SandboxConfig | None = None, correct_reward: float = 1.0,
                 wrong_reward: float = -1.0, system_prompt: str | None = None,
                 max_calls_per_turn: int | None = None, tool_format: str = "default",
                 prompt_field: str = "prompt"):
        self.tool_format = fmt = get_tool_format(tool_format)
        if prompt_field not in fmt.prompt_fields:
            raise ValueError(f"env_config.prompt_field must be one of {list(fmt.prompt_fields)} for "
                             f"tool_format {fmt.name!r}, got {prompt_field!r}")
        self.prompt_field = prompt_field
        max_calls = fmt.max_calls_per_turn if max_calls_per_turn is None else max_calls_per_turn
        self.parser, self.parser_name = self._make_parser(fmt, parser, max_calls)
        self.tag = self.parser.tag
        if system_prompt:
            self.system_prompt: str | None = system_prompt
        elif fmt.system_prompts is None:
            self.system_prompt = None
        elif self.parser_name in fmt.system_prompts:
            self.system_prompt = fmt.system_prompts[self.parser_name]
        else:
            raise ValueError(f"parser {self.parser_name!r} has no built-in code_math prompt; pass system_prompt "
                             "in env_config")
        self.tool_schemas = [dict(s) for s in fmt.tool_schemas] if fmt.tool_schemas else None
        self.max_turns = int(max_turns)
        self.max_obs_chars = int(fmt.max_obs_chars if max_obs_chars is None else max_obs_chars)
        self.stateful_default = stateful
        self.correct_reward = correct_reward
        self.wrong_reward = wrong_reward
        self._sandbox = sandbox
        if isinstance(sandbox_config, dict):
            sandbox_config = SandboxConfig(**{**fmt.sandbox, **sandbox_config})
        self._sandbox_config = sandbox_config or SandboxConfig(**fmt.sandbox)
        # Select the backend now, so that a machine without bubblewrap refuses when the runner
        # starts (naming the fix), not at the first tool call of a training run.
        _ = self.sandbox
        self._check_sandbox_imports()
        self.done = True
        self._new_episode()

    @staticmethod
    def _make_parser(fmt: CodeToolFormat, parser: str | None, max_calls: int):
        if callable(fmt.parser):  # the format's own call rule
            if parser is not None:
                raise ValueError(f"tool_format {fmt.name!r} parses calls by its released rule; drop "
                                 f"env_config.parser (got {parser!r})")
            p = fmt.parser(max_calls)
            return p, p.name
        name = parser or fmt.parser or "code"
        # any registered parser whose calls run code (rllib_spear.envs.parsers.register_parser)
        return get_parser(name, supported_calls=("code_interpreter",), env_options={
            "tools": {"code_interpreter": ("code_interpreter", "code"), "python": ("code_interpreter", "code")},
            "max_calls": max_calls}), name

    def _check_sandbox_imports(self) -> None:
        """The format's prelude imports (ReTool: numpy) must work inside the sandbox: checked
        once per sandbox configuration, when the environment is built."""
        mods = tuple(self.tool_format.sandbox_imports)
        key = (_sandbox_key(self.sandbox.config), mods)
        if not mods or key in _IMPORTS_OK:
            return
        res = self.sandbox.run("import " + ", ".join(mods))
        if not res.ok:
            why = (res.stderr or res.output or res.error or "").strip().splitlines()[-1:] or ["unknown error"]
            raise RuntimeError(
                f"tool_format {self.tool_format.name!r} needs {', '.join(mods)} inside the code sandbox, but "
                f"`import {', '.join(mods)}` failed there ({why[0][:200]}). Fix: install it into the Python "
                f"environment the sandbox runs ({self.sandbox.config.python or sys.executable}: `pip install {' '.join(mods)}`) "
                "and keep sandbox_config site_packages=True (the sandbox imports this environment's "
                "site-packages read-only).")
        _IMPORTS_OK.add(key)

    @property
    def sandbox(self) -> PythonSandbox:
        if self._sandbox is None:
            key = _sandbox_key(self._sandbox_config)
            sb = _SANDBOXES.get(key)
            if sb is None:
                sb = _SANDBOXES[key] = PythonSandbox(self._sandbox_config)
            self._sandbox = sb
        return self._sandbox

    def _new_episode(self):
        self.turns = 0
        self.tool_calls = 0
        self.queries_per_step: list[int] = []
        self.history: list[str] = []
        self.format_errors: list[str] = []
        self.has_answer = False
        self.correct = False
        self.outcome = 0.0
        self.answer: str | None = None
        self.exec_errors = 0

    def reset(self, task: dict[str, Any]) -> list[dict[str, str]]:
        self._new_episode()
        self.task = task
        self.stateful = bool(task.get("stateful", self.stateful_default))
        self.done = False
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": self.tool_format.user_text(task, self.prompt_field)}]

    @property
    def obs_budget(self) -> int:
        """Most characters of one observation (all calls, tags and error text included)."""
        return max(self.max_obs_chars, 0) + OBS_SLACK_CHARS

    def _run(self, code: str, limit: int | None = None) -> str:
        code = self.tool_format.code_prefix + code
        res = self.sandbox.run(code, history=self.history if self.stateful else None)
        if not res.ok:
            self.exec_errors += 1
        elif self.stateful:
            self.history.append(code)
        return self.tool_format.result_text(res, self.max_obs_chars if limit is None else limit)

    def _bound(self, obs: str) -> str:
        """Safety net: an observation over ``obs_budget`` is cut, keeping its closing tag."""
        if len(obs) <= self.obs_budget:
            return obs
        close = f"</{self.tag}>"
        return clip(obs[: -len(close)], self.obs_budget - len(close)) + close

    def step(self, assistant_text: str) -> StepResult:
        turn = begin_turn(self, assistant_text)
        if turn is None:
            return StepResult(None, 0.0, True, {"error": "episode is over; call reset()"})
        assistant_text, parsed = turn
        info: dict[str, Any] = {"action": parsed.kind}
        gold = str(self.task.get("answer", ""))
        if parsed.kind == "answer":
            self.queries_per_step.append(0)
            # a turn whose calls could not run and that ends the episode (the retool rule)
            self.format_errors.extend(f"turn {self.turns}: {n}" for n in parsed.notes)
            return self._final(*self.tool_format.answer(assistant_text, gold), info)
        self.queries_per_step.append(parsed.num_queries)
        if self.turns >= self.max_turns:
            info["truncated"] = True
            scored = self.tool_format.answer(assistant_text, gold) if self.tool_format.score_truncated else (None, False)
            return self._final(*scored, info)
        if parsed.kind == "tool":
            self.tool_calls += 1
            calls = parsed.calls[: max(1, getattr(self.parser, "max_calls", 1))]
            per_call = max(1, self.max_obs_chars // len(calls))  # parallel calls share the budget
            texts = [clip(f"Error: {call.error}", _ERROR_CHARS) if call.error
                     else self._run(call.arguments["code"], per_call) for call in calls]
            if self.tool_format.tag_results:
                obs = self._bound("\n".join(f"<{self.tag}>{t}</{self.tag}>" for t in texts))
            else:  # bare text, each already cut by the format: the chat template renders it as a tool message
                obs = "\n".join(texts)
        else:
            self.format_errors.append(f"turn {self.turns}: {parsed.error}")
            obs = self._bound(f"<{self.tag}>Error: {clip(parsed.error, self.obs_budget)}</{self.tag}>")
            info["error"] = parsed.error
        return StepResult(obs, 0.0, False, info)

    def _final(self, answer: str | None, correct: bool, info: dict) -> StepResult:
        self.done = True
        self.answer = answer
        self.has_answer = answer is not None
        self.correct = bool(correct)
        self.outcome = self.correct_reward if self.correct else self.wrong_reward
        info.update(correct=self.correct, answer=answer)
        return StepResult(None, self.outcome, True, info)

    def episode_stats(self) -> EpisodeStats:
        return EpisodeStats.coerce({
            "tool_calls": self.tool_calls,
            "queries_per_step": list(self.queries_per_step),
            "success": self.correct,
            "correct": self.correct,
            "format_ok": not self.format_errors and self.has_answer,
            "has_answer": self.has_answer,
            "outcome_reward": self.outcome,
            "turns": self.turns,
            "exec_errors": self.exec_errors,
            "answer": self.answer,
            # which isolation ran this episode's code; "weak" = not bubblewrap (allow_weak_sandbox)
            "sandbox_backend": self.sandbox.backend,
            "sandbox_weak": self.sandbox.backend != "bwrap",
        }, type(self).__name__)
