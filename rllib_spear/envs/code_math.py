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
"""
from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from rllib_spear.core.episode import EpisodeStats
from rllib_spear.envs.base import StepResult, ToolEnv
from rllib_spear.envs.parsers import MAX_CALLS_PER_TURN, begin_turn, clip, extract_boxed, get_parser
from rllib_spear.envs.sandbox import PythonSandbox, SandboxConfig

__all__ = ["CodeMathEnv", "math_answers_match", "CODE_PROMPTS"]

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


class CodeMathEnv(ToolEnv):
    """Task keys: ``prompt`` (problem text), ``answer`` (ground truth); optional ``stateful``."""

    def __init__(self, *, parser: str = "code", max_turns: int = 4, max_obs_chars: int = 1000,
                 stateful: bool = False, sandbox: PythonSandbox | None = None,
                 sandbox_config: dict | SandboxConfig | None = None, correct_reward: float = 1.0,
                 wrong_reward: float = -1.0, system_prompt: str | None = None,
                 max_calls_per_turn: int = MAX_CALLS_PER_TURN):
        # any registered parser whose calls run code (rllib_spear.envs.parsers.register_parser)
        self.parser = get_parser(parser, supported_calls=("code_interpreter",), env_options={
            "tools": {"code_interpreter": ("code_interpreter", "code"), "python": ("code_interpreter", "code")},
            "max_calls": max_calls_per_turn})
        self.parser_name = parser
        self.tag = self.parser.tag
        if not system_prompt and parser not in CODE_PROMPTS:
            raise ValueError(f"parser {parser!r} has no built-in code_math prompt; pass system_prompt in env_config")
        self.max_turns = int(max_turns)
        self.max_obs_chars = int(max_obs_chars)
        self.stateful_default = stateful
        self.correct_reward = correct_reward
        self.wrong_reward = wrong_reward
        self.system_prompt = system_prompt or CODE_PROMPTS[parser]
        self._sandbox = sandbox
        if isinstance(sandbox_config, dict):
            sandbox_config = SandboxConfig(**sandbox_config)
        self._sandbox_config = sandbox_config or SandboxConfig(wall_timeout_s=10.0, cpu_time_s=5)
        # Select the backend now, so that a machine without bubblewrap refuses when the runner
        # starts (naming the fix), not at the first tool call of a training run.
        _ = self.sandbox
        self.done = True
        self._new_episode()

    @property
    def sandbox(self) -> PythonSandbox:
        if self._sandbox is None:
            key = tuple(sorted((k, repr(v)) for k, v in vars(self._sandbox_config).items()))
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
        return [{"role": "system", "content": self.system_prompt},
                {"role": "user", "content": str(task["prompt"])}]

    @property
    def obs_budget(self) -> int:
        """Most characters of one observation (all calls, tags and error text included)."""
        return max(self.max_obs_chars, 0) + OBS_SLACK_CHARS

    def _format_output(self, res, limit: int | None = None) -> str:
        limit = self.max_obs_chars if limit is None else limit
        out = res.output or ""
        if len(out) > limit:
            out = out[:limit] + f"\n...[output truncated, {len(res.output)} chars in total]"
        if res.error:
            out = (out + "\n" if out else "") + clip(f"Error: {res.error}", _ERROR_CHARS)
        if not out.strip():
            out = "(no output; use print() to see values)"
        return out

    def _run(self, code: str, limit: int | None = None) -> str:
        res = self.sandbox.run(code, history=self.history if self.stateful else None)
        if not res.ok:
            self.exec_errors += 1
        elif self.stateful:
            self.history.append(code)
        return self._format_output(res, limit)

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
        if parsed.kind == "answer":
            self.queries_per_step.append(0)
            ans = parsed.answer if self.parser_name == "code" else extract_boxed(assistant_text)
            return self._final(ans, info)
        self.queries_per_step.append(parsed.num_queries)
        if self.turns >= self.max_turns:
            info["truncated"] = True
            return self._final(None, info)
        if parsed.kind == "tool":
            self.tool_calls += 1
            parts = []
            calls = parsed.calls[: max(1, getattr(self.parser, "max_calls", 1))]
            per_call = max(1, self.max_obs_chars // len(calls))  # parallel calls share the budget
            for call in calls:
                text = (clip(f"Error: {call.error}", _ERROR_CHARS) if call.error
                        else self._run(call.arguments["code"], per_call))
                parts.append(f"<{self.tag}>{text}</{self.tag}>")
            obs = self._bound("\n".join(parts))
        else:
            self.format_errors.append(f"turn {self.turns}: {parsed.error}")
            obs = self._bound(f"<{self.tag}>Error: {clip(parsed.error, self.obs_budget)}</{self.tag}>")
            info["error"] = parsed.error
        return StepResult(obs, 0.0, False, info)

    def _final(self, answer: str | None, info: dict) -> StepResult:
        self.done = True
        self.answer = answer
        self.has_answer = answer is not None
        self.correct = math_answers_match(answer, str(self.task.get("answer", "")))
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
