"""An agent program as an environment: :class:`AgentProgramEnv` (docs/design.md "The OpenAI endpoint").

The user's agent is a function ``program(task, client) -> reward``: ``task`` is one task dict of
the dataset, ``client`` an ``openai.OpenAI`` (a plain ``def``) or ``openai.AsyncOpenAI`` (an
``async def``) pointed at the env runner's endpoint for this episode (its own base URL and the
run's key); the program calls the model as it would any OpenAI model, under the endpoint's model
name (``"policy"`` unless ``serve_openai={'model_name': ...}`` renames it), runs its own tools,
memory and control flow, and returns a number: the episode's reward::

    def agent(task, client):
        messages = [{"role": "user", "content": task["question"]}]
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        ...
        return float(answer == task["answer"])

    config.environment("agent_program", env_config={"program": "my_agents:agent"}, dataset=tasks) \\
          .env_runners(rollout_mode="agent_program")

``program`` is the function itself or an import path ``"pkg.module:function"`` (imported in the
env runner's process, as any env spec: rllib_spear/envs/registry.py). The rollout mode
``"agent_program"`` (env_runners/agent_program_rollout.py) runs the programs of many episodes
concurrently (``async def`` ones on the runner's agent loop, plain ones on worker threads), each
for at most ``episode_timeout_s``; every call they make is captured with its exact tokens and
log-probs and becomes the episode's trajectory (core/call_layout.py).

A program that raises, returns something that is not a finite number, or runs past
``episode_timeout_s`` ends its episode failed: reward 0, ``success`` False, the error in the
trajectory's ``rollout.error`` and counted (``agent_program_errors`` / ``agent_program_timeouts``);
the runner goes on. ``episode_stats()``: ``tool_calls`` counts the tool calls of the model's chat
replies (the endpoint reads them from the completions), ``queries_per_step`` those of each call,
``format_ok`` no unreadable ``<tool_call>`` block, ``has_answer`` the program returned, ``success``
reward >= ``success_threshold``.

``reset`` / ``step`` are the ``ToolEnv`` interface the other rollout modes drive: this environment
has no text steps, so ``step`` refuses, naming the rollout mode to use.
"""
from __future__ import annotations

import importlib
import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable

from ..core.episode import EpisodeStats
from .base import StepResult, ToolEnv

__all__ = ["AgentProgramEnv", "ProgramOutcome", "resolve_program", "is_async_program", "program_reward",
           "is_agent_program_env", "DEFAULT_EPISODE_TIMEOUT_S"]

#: Generous: a program that hangs (a dead tool, a loop that never ends) cannot stall a run.
DEFAULT_EPISODE_TIMEOUT_S = 600.0


def resolve_program(program: Any) -> Callable[..., Any]:
    """The program a spec names: a callable, or an import path ``"pkg.module:function"``."""
    if callable(program):
        return program
    if not isinstance(program, str) or ":" not in program:
        raise ValueError(f"AgentProgramEnv: program must be a function (task, client) -> reward or an import path "
                         f"'pkg.module:function', got {program!r:.80}")
    mod_name, _, attr = program.partition(":")
    try:
        obj: Any = importlib.import_module(mod_name)
    except ImportError as e:
        raise ValueError(f"AgentProgramEnv: cannot import {mod_name!r} of program {program!r} ({e}); the module must "
                         "be importable in the env runner's process (Ray puts the driver's working directory on "
                         "its sys.path; ship anything else with ray.init(runtime_env={'py_modules': [...]}))") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"AgentProgramEnv: module {mod_name!r} has no attribute {attr!r} (program {program!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"AgentProgramEnv: program {program!r} is not callable")
    return obj


def is_async_program(fn: Callable[..., Any]) -> bool:
    """An ``async def`` (or an object whose ``__call__`` is one): it gets an ``AsyncOpenAI``."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


@dataclass(frozen=True)
class ProgramOutcome:
    """How one run of the program ended: its ``reward`` (0 when it failed), the ``error``
    (``"<Type>: message"``) or None, whether it ran past ``episode_timeout_s``; and what the
    endpoint counted of its calls (per call: tool calls in the reply; unreadable blocks)."""

    reward: float
    error: str | None = None
    timed_out: bool = False
    tool_calls_per_call: tuple[int, ...] = ()
    malformed_tool_calls: int = 0

    @property
    def failed(self) -> bool:
        return self.error is not None


def program_reward(value: Any) -> float:
    """The reward a program returned, as a finite float; ``TypeError`` / ``ValueError`` else."""
    if isinstance(value, bool):
        return float(value)
    try:
        reward = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"the program returned {type(value).__name__} {value!r:.60}; it must return the episode's "
                        "reward, a number") from None
    if not math.isfinite(reward):
        raise ValueError(f"the program returned a non-finite reward {reward!r}")
    return reward


class AgentProgramEnv(ToolEnv):
    """The user's agent program as an environment (see the module doc).

    Args:
        program: ``program(task, client) -> reward`` (``def`` or ``async def``), or its import path
            ``"pkg.module:function"``.
        episode_timeout_s: seconds one run may take before it is a failed episode (None: no limit).
        success_threshold: ``success`` = reward >= this.
        max_turns: accepted for the runner's shared turn limit, not used (the program decides).
    """

    system_prompt = ""  # the program writes its own prompts

    def __init__(self, program: Any = None, episode_timeout_s: float | None = DEFAULT_EPISODE_TIMEOUT_S,
                 success_threshold: float = 1.0, max_turns: int | None = None) -> None:
        if program is None:
            raise ValueError("AgentProgramEnv needs env_config={'program': fn or 'pkg.module:function'}, a function "
                             "(task, client) -> reward")
        self.program = resolve_program(program)
        self.is_async = is_async_program(self.program)
        if episode_timeout_s is not None and (isinstance(episode_timeout_s, bool) or not isinstance(
                episode_timeout_s, (int, float)) or not episode_timeout_s > 0):
            raise ValueError(f"AgentProgramEnv: episode_timeout_s must be a number of seconds > 0 or None (no "
                             f"limit), got {episode_timeout_s!r}")
        self.episode_timeout_s = None if episode_timeout_s is None else float(episode_timeout_s)
        self.success_threshold = float(success_threshold)
        self.task: dict[str, Any] = {}
        self.outcome: ProgramOutcome | None = None

    # ------------------------------------------------------------------ ToolEnv
    def reset(self, task: dict[str, Any]) -> list[dict[str, str]]:
        """Start an episode of ``task``: no messages (the program writes its own)."""
        self.task, self.outcome = dict(task), None
        return []

    def step(self, assistant_text: str) -> StepResult:
        raise RuntimeError("AgentProgramEnv has no text steps: the program calls the model itself; train it with "
                           ".env_runners(rollout_mode='agent_program')")

    def record(self, outcome: ProgramOutcome) -> None:
        """How the episode's run ended (the rollout calls it once the program returned)."""
        self.outcome = outcome

    def episode_stats(self) -> EpisodeStats:
        o = self.outcome
        if o is None:
            raise RuntimeError("AgentProgramEnv.episode_stats before the program ran (rollout_mode='agent_program' "
                               "records its outcome)")
        ok = not o.failed
        return EpisodeStats(success=ok and o.reward >= self.success_threshold, outcome_reward=o.reward,
                            tool_calls=sum(o.tool_calls_per_call), queries_per_step=list(o.tool_calls_per_call),
                            format_ok=ok and o.malformed_tool_calls == 0, has_answer=ok,
                            extra={"model_calls": len(o.tool_calls_per_call), "program_error": o.error,
                                   "program_timed_out": o.timed_out})


def is_agent_program_env(spec: Any) -> bool:
    """Whether the env spec ``spec`` (a name, import path or class) builds an
    :class:`AgentProgramEnv`; False for a factory or a spec that does not resolve (the config's
    ``env`` check names that one)."""
    from .registry import resolve_env

    try:
        cls = resolve_env(spec).env_cls
    except Exception:  # noqa: BLE001 - an unresolvable env is reported by validate()'s env check
        return False
    return cls is not None and issubclass(cls, AgentProgramEnv)
