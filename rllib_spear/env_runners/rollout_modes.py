"""The registry of rollout modes: the one list of ``rollout_mode`` names (docs/design.md "The
agent loop").

A rollout mode is how one LLMEnvRunner schedules its episodes: "turn_sync" (``MultiTurnRollout``:
every episode's turn t in one engine batch, then every env step), "async"
(``AsyncMultiTurnRollout``: every episode at its own pace on the agent loop) or "agent_program"
(``AgentProgramRollout``: every episode runs the user's agent program against the runner's OpenAI
endpoint, docs/design.md "The OpenAI endpoint"). ``rollout_mode="auto"`` (the default) is not a
mode but a choice among them, made by :func:`resolve_rollout_mode` from the config: the agent
program's loop for an ``AgentProgramEnv``, the async loop for multi-turn episodes (or the "async"
pipeline), the turn-synchronous one for single-turn episodes. The runner builds
its training and evaluation rollouts with :func:`make_rollout`; ``GRPOConfig.validate()`` checks
``rollout_mode`` against :func:`rollout_mode_names`; the "async" pipeline asks for a mode that
streams groups (:func:`streaming_rollout_modes`). A mode of your own::

    from rllib_spear.env_runners.rollout_modes import RolloutMode, register_rollout_mode

    @register_rollout_mode("my_loop")
    class MyLoop(RolloutMode):
        def build(self, *, step_timeout_s, tool_concurrency, **rollout_kwargs):
            return MyRollout(**rollout_kwargs, step_timeout_s=step_timeout_s)

``rllib_spear.testing.check_rollout_mode_contract("my_loop")`` checks it as the built-ins are:
a mode changes when episodes run, never what they record.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar

from ..registry import Registry
from .async_rollout import AsyncMultiTurnRollout
from .rollout import DEFAULT_STEP_TIMEOUT_S, MultiTurnRollout

__all__ = ["RolloutMode", "ROLLOUT_MODES", "AUTO", "register_rollout_mode", "get_rollout_mode", "rollout_mode_names",
           "streaming_rollout_modes", "resolve_rollout_mode", "make_rollout", "TurnSyncMode", "AsyncMode", "AgentProgramMode"]


class RolloutMode(ABC):
    """One ``rollout_mode``: builds the runner's rollout (a ``MultiTurnRollout``: ``run(tasks,
    group_size, policy_version)`` -> (trajectories, ``RolloutStats``))."""

    #: the registered name (set by ``register_rollout_mode``)
    name: ClassVar[str] = ""
    #: whether its rollouts stream groups (``arun_group``), as ``rollout_pipeline="async"`` needs
    streams_groups: ClassVar[bool] = False
    #: whether its rollouts run agent programs against the runner's OpenAI endpoint (serving/):
    #: the runner then starts one and passes it to ``build`` as ``endpoint``
    serves_openai: ClassVar[bool] = False

    @abstractmethod
    def build(self, *, step_timeout_s: float | None, tool_concurrency: int | None,
              **rollout_kwargs: Any) -> MultiTurnRollout:
        """The rollout. ``step_timeout_s``: the env-step watchdog (None: no limit);
        ``tool_concurrency``: env steps at once (None: one per episode; a mode that steps
        envs one batch at a time ignores it); ``rollout_kwargs``: ``MultiTurnRollout``'s
        arguments (engine, tokenizer, env_factory, sampling, config)."""

    def engine_defaults(self, engine: str, *, seeded: bool = False) -> dict[str, Any]:
        """``engine_kwargs`` this mode needs of an ``engine`` ("hf" | "vllm") unless set;
        ``seeded``: the run has a fixed seed (``.debugging(seed=...)``) it must reproduce."""
        return {}


ROLLOUT_MODES: Registry[type[RolloutMode]] = Registry(
    "rollout mode", register_hint="rllib_spear.env_runners.rollout_modes.register_rollout_mode")


def register_rollout_mode(name: str, *, override: bool = False) -> Callable[[type[RolloutMode]], type[RolloutMode]]:
    """Class decorator: register a :class:`RolloutMode` subclass as ``rollout_mode=name``."""
    def add(cls: type[RolloutMode]) -> type[RolloutMode]:
        if not (isinstance(cls, type) and issubclass(cls, RolloutMode)):
            raise TypeError(f"register_rollout_mode({name!r}) takes a RolloutMode subclass, got {cls!r}")
        ROLLOUT_MODES.register(name, cls, override=override)
        cls.name = name
        return cls

    return add


def get_rollout_mode(name: str) -> RolloutMode:
    """The mode registered as ``name`` (ValueError naming the choices otherwise)."""
    return ROLLOUT_MODES.get(name)()


def rollout_mode_names() -> list[str]:
    """The registered names, in registration order (the built-ins: turn_sync, async)."""
    return list(ROLLOUT_MODES.view())


def streaming_rollout_modes() -> list[str]:
    """The names of the modes whose rollouts stream groups (``rollout_pipeline="async"``)."""
    return [n for n, cls in ROLLOUT_MODES.view().items() if cls.streams_groups]


#: ``rollout_mode`` that picks a registered mode from the config (:func:`resolve_rollout_mode`)
AUTO = "auto"


def resolve_rollout_mode(name: str, *, max_turns: int, streams_groups: bool = False,
                         runs_agent_program: bool = False) -> str:
    """The registered mode that ``rollout_mode=name`` runs: ``name`` itself unless it is
    ``"auto"``, which picks

    - "agent_program" when the environment is an agent program (``runs_agent_program``): only
      that loop can run one;
    - "async" when an episode can take several turns (``max_turns > 1``) or the pipeline needs
      groups streamed (``streams_groups``: ``rollout_pipeline="async"``): an episode waiting on
      its tool does not hold the others' turns (5.7x the episodes/s of "turn_sync" under lognormal tool latency, 0.99x with
      none: docs/benchmarks.md), and with a fixed seed each request samples from its own seed, so
      the run is reproducible whatever the timing (docs/design.md "The agent loop");
    - "turn_sync" otherwise: single-turn episodes have no tool wait to overlap, and one batch per
      turn is the simplest schedule."""
    if name != AUTO:
        return name
    if runs_agent_program:
        return "agent_program"
    if int(max_turns) > 1 or streams_groups:
        return "async"
    return "turn_sync"


def make_rollout(mode: str, *, step_timeout_s: float | None = DEFAULT_STEP_TIMEOUT_S,
                 tool_concurrency: int | None = None, **rollout_kwargs: Any) -> MultiTurnRollout:
    """The rollout of ``rollout_mode`` ``mode`` (see :meth:`RolloutMode.build`)."""
    return get_rollout_mode(mode).build(step_timeout_s=step_timeout_s, tool_concurrency=tool_concurrency,
                                        **rollout_kwargs)


@register_rollout_mode("turn_sync")
class TurnSyncMode(RolloutMode):
    """``MultiTurnRollout``: one engine batch per turn, then the env steps (``tool_concurrency``
    does not apply); ``step_timeout_s`` ends a hung step's episode as an ``env_step`` error."""

    def build(self, *, step_timeout_s: float | None, tool_concurrency: int | None,
              **rollout_kwargs: Any) -> MultiTurnRollout:
        return MultiTurnRollout(**rollout_kwargs, step_timeout_s=step_timeout_s)


@register_rollout_mode("async")
class AsyncMode(RolloutMode):
    """``AsyncMultiTurnRollout``: every episode at its own pace; ``step_timeout_s`` is its tool
    timeout (the step's observation says it timed out and the episode goes on)."""

    streams_groups = True

    def build(self, *, step_timeout_s: float | None, tool_concurrency: int | None,
              **rollout_kwargs: Any) -> MultiTurnRollout:
        return AsyncMultiTurnRollout(**rollout_kwargs, tool_concurrency=tool_concurrency,
                                     tool_timeout_s=step_timeout_s)

    def engine_defaults(self, engine: str, *, seeded: bool = False) -> dict[str, Any]:
        # vLLM's async engine: each episode's request joins the running batch. Which requests
        # share a decode step depends on timing, so a seeded run seeds each request on its own
        # (request_seed), as the HF engine's per-row streams do; unseeded runs skip vLLM's
        # per-request generators (~4% of a zero-latency call on CPU, docs/design.md "The agent loop").
        if engine != "vllm":
            return {}
        return {"async_engine": True, **({"per_request_seeds": True} if seeded else {})}


@register_rollout_mode("agent_program")
class AgentProgramMode(RolloutMode):
    """``AgentProgramRollout`` (env_runners/agent_program_rollout.py): every episode runs the
    user's agent program (``AgentProgramEnv``) against the runner's OpenAI endpoint, its calls
    captured token for token; ``tool_concurrency`` bounds the threads of plain-``def`` programs,
    a program is bounded by its own ``episode_timeout_s`` (``step_timeout_s`` does not apply)."""

    streams_groups = True
    serves_openai = True

    def build(self, *, step_timeout_s: float | None, tool_concurrency: int | None,
              **rollout_kwargs: Any) -> Any:
        from .agent_program_rollout import AgentProgramRollout

        return AgentProgramRollout(**rollout_kwargs, tool_concurrency=tool_concurrency)

    def engine_defaults(self, engine: str, *, seeded: bool = False) -> dict[str, Any]:
        # as the async loop's: the endpoint's requests join the running batch, seeded one by one
        return AsyncMode.engine_defaults(self, engine, seeded=seeded)
