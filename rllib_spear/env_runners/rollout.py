"""The multi-turn rollout loop: engine + tokenizer + tool environments -> Trajectories.

No Ray here: ``LLMEnvRunner`` wraps this class for RLlib, and tests drive it directly. This is
the turn-synchronous loop (``rollout_mode="turn_sync"``); env_runners/async_rollout.py runs the
same pieces with one coroutine per episode (docs/design.md "The agent loop").

Token-in/token-out: the prompt is tokenized once from the environment's initial messages with
the chat template; each assistant turn keeps exactly the ids the engine sampled (never decoded
and re-encoded); each observation is tokenized once, wrapped by ``ObservationTemplate`` into a
new user turn (or, with ``"chat_template"``, a ``tool`` message as the tokenizer's chat template
renders it) followed by the generation prompt of the next assistant turn.

Robustness: model text and tool output pass through ``safe_text`` (lone surrogates and other
code points a tokenizer cannot encode become U+FFFD) before they reach the environment or the
tokenizer, and any exception while building a turn (decode, env step, observation formatting,
tokenization, template) ends only that episode: it is marked truncated, its trajectory carries
``rollout.error = "<ExceptionType>: message"`` (and ``rollout.error_stage``), and
``RolloutStats.rollout_errors`` counts it. The other episodes of the batch go on normally.
An environment whose ``episode_stats()`` breaks the :class:`EpisodeStats` contract (a missing or
mistyped key) is a bug of that environment, not of one episode: the rollout raises, naming it.

Step watchdog (``step_timeout_s``, None = no limit; docs/design.md "Fault tolerance"): env steps
run on one worker thread of a ``ToolPool``; a step still running after ``step_timeout_s`` ends its
episode as an ``env_step`` error (:class:`EnvStepTimeout`), counted in ``RolloutStats.step_timeouts``
(and ``tool_calls_abandoned``: its thread is left to finish). The abandoned call still owns the
environment, so that environment is never read again (no ``episode_stats``: the episode's record
is the error) nor reused; the other episodes of the batch go on.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..core.episode import EpisodeStats, EpisodeStatsError, RolloutRecord
from ..core.filters import is_overlong
from ..core.trajectory import Segment, Trajectory
from ..envs.base import StepResult, ToolEnv, supports_step_prompt
from .engines.base import GenerationEngine, GenerationOutput, SamplingConfig
from .text_safety import safe_text
from .tool_pool import ToolPool

logger = logging.getLogger(__name__)

__all__ = ["ObservationTemplate", "RolloutConfig", "RolloutStats", "MultiTurnRollout", "step_rewards_from_env",
           "DEFAULT_STEP_TIMEOUT_S", "EnvStepTimeout", "resolve_step_timeout", "STEP_CONTEXTS",
           "check_step_context", "require_step_prompt"]

#: The sample layouts (``.env_runners(step_context=...)``, docs/design.md "Sample layouts: full
#: and window"): "full" = the episode is one growing context; "window" = each step is sampled
#: from its own prompt (``ToolEnv.step_prompt``) and is one learner sample.
STEP_CONTEXTS = ("full", "window")


def check_step_context(step_context: Any, history_steps: Any, max_prompt_tokens: Any, max_model_len: Any,
                       min_generation_tokens: int = 8) -> list[str]:
    """The problems of the layout knobs, each naming the ``.env_runners(...)`` key and the fix
    (empty when they are fine); shared by ``RolloutConfig`` and ``GRPOConfig.validate()``."""
    out = []
    if step_context not in STEP_CONTEXTS:
        out.append(f"`step_context` must be 'full' (one context per episode) or 'window' (one sample per step, "
                   f"its prompt from the env's step_prompt) (.env_runners(step_context=...)), got {step_context!r}")
    if isinstance(history_steps, bool) or not isinstance(history_steps, (int, np.integer)) or history_steps < 0:
        out.append(f"`history_steps` (earlier steps shown in a window-layout step prompt) must be an integer >= 0 "
                   f"(.env_runners(history_steps=2)), got {history_steps!r}")
    m = max_prompt_tokens
    if m is not None:
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
            out.append(f"`max_prompt_tokens` (the window layout's per-step prompt budget) must be an integer >= 1 or "
                       f"None (.env_runners(max_prompt_tokens=2048)), got {m!r}")
        elif isinstance(max_model_len, (int, np.integer)) and m + min_generation_tokens > max_model_len:
            out.append(f"`max_prompt_tokens` ({m}) leaves less than {min_generation_tokens} tokens of `max_model_len` "
                       f"({max_model_len}) to generate in: set max_model_len >= max_prompt_tokens + max_new_tokens "
                       "(.env_runners(max_model_len=...))")
        elif step_context == "full":
            out.append(f"`max_prompt_tokens` ({m}) is the window layout's per-step prompt budget; with "
                       "step_context='full' it means nothing: leave it None, or set step_context='window'")
    return out


def require_step_prompt(env: Any, label: str | None = None) -> None:
    """ValueError unless ``env`` (an instance or class) implements ``ToolEnv.step_prompt``, the
    hook the window layout needs."""
    if not supports_step_prompt(env):
        name = label or (env.__name__ if isinstance(env, type) else type(env).__name__)
        raise ValueError(f"step_context='window' needs the environment's per-step prompt, but {name} does not "
                         "implement ToolEnv.step_prompt(history_steps) (the chat messages of the next step: the task, "
                         "the last history_steps (observation, action) pairs, the current observation; see "
                         "rllib_spear.envs.text_game.GymTextToolEnv); implement it, or use "
                         ".env_runners(step_context='full')")

#: Generous: no healthy env step comes near it (the code sandbox caps a cell at 30 s on its own),
#: so it changes no result, yet a hung step (a dead HTTP endpoint) cannot stall a run forever.
#: The async loop's ``tool_timeout_s`` has the same default (async_rollout.DEFAULT_TOOL_TIMEOUT_S).
DEFAULT_STEP_TIMEOUT_S = 300.0


class EnvStepTimeout(TimeoutError):
    """An env step of the turn-synchronous loop ran past ``step_timeout_s``."""


def _check_timeout(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number of seconds > 0, or None for no limit "
                         f"(.env_runners({name}=...)), got {value!r}")
    return float(value)


def resolve_step_timeout(step_timeout_s: Any, tool_timeout_s: Any) -> float | None:
    """The env-step limit of both agent loops from the two knobs that may set it:
    ``step_timeout_s`` (its name) and ``tool_timeout_s`` (the async loop's older name for it).
    Both default to ``DEFAULT_STEP_TIMEOUT_S``; the one set to something else wins; two different
    non-default values are a ValueError naming both."""
    step, tool = _check_timeout("step_timeout_s", step_timeout_s), _check_timeout("tool_timeout_s", tool_timeout_s)
    if tool == DEFAULT_STEP_TIMEOUT_S:
        return step
    if step == DEFAULT_STEP_TIMEOUT_S or step == tool:
        return tool
    raise ValueError(f"step_timeout_s={step_timeout_s!r} and tool_timeout_s={tool_timeout_s!r} both set the "
                     "env-step limit (tool_timeout_s is the async loop's older name for step_timeout_s): set "
                     "only .env_runners(step_timeout_s=...)")


@dataclass(frozen=True)
class ObservationTemplate:
    """How a tool observation is rendered as tokens after an assistant turn.

    The assistant turn ends with the end-of-turn token the model sampled (e.g. ``<|im_end|>``);
    the observation segment adds what the chat template puts after it, the observation as a
    user turn, and the next assistant header.
    """

    prefix: str
    suffix: str

    @classmethod
    def named(cls, name: str, tokenizer: Any = None) -> "ObservationTemplate":
        """``"chatml"`` / ``"llama3"`` (a user turn), or ``"chat_template"`` (a ``tool`` role
        message rendered by ``tokenizer``'s own chat template, :meth:`from_chat_template`)."""
        if name == "chatml":  # Qwen2.5/Qwen3, SmolLM2, the embedded model
            return cls("\n<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n")
        if name == "llama3":
            return cls(
                "<|start_header_id|>user<|end_header_id|>\n\n",
                "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
            )
        if name == "chat_template":
            return cls.from_chat_template(tokenizer)
        raise ValueError(
            f"observation_template must be 'chatml', 'llama3' or 'chat_template', got {name!r}"
        )

    @classmethod
    def from_chat_template(cls, tokenizer: Any, role: str = "tool") -> "ObservationTemplate":
        """The observation as a ``role`` message, rendered by ``tokenizer.apply_chat_template``.

        Two renderings of a probe conversation, [user, assistant] without and
        [user, assistant, ``role``] with the generation prompt, differ by the observation turn
        and the next assistant header. The sampled assistant turn ends with the end-of-turn
        (eos) token, so what the template writes after that token (Qwen2.5: ``\n``) opens the
        prefix. Qwen2.5: prefix ``\n<|im_start|>user\n<tool_response>\n``, suffix
        ``\n</tool_response><|im_end|>\n<|im_start|>assistant\n``.
        """
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError("observation_template 'chat_template' needs a tokenizer with a chat template; "
                             "use 'chatml' or 'llama3' for one without")
        said, seen = "ASSISTANT_PROBE_7f3a", "OBSERVATION_PROBE_9c2d"
        base = [{"role": "user", "content": "USER_PROBE_41b8"}, {"role": "assistant", "content": said}]
        try:
            before = tokenizer.apply_chat_template(base, tokenize=False, add_generation_prompt=False)
            after = tokenizer.apply_chat_template([*base, {"role": role, "content": seen}], tokenize=False,
                                                  add_generation_prompt=True)
        except Exception as exc:  # a template that rejects the role or the turn order
            raise ValueError(f"observation_template 'chat_template': the chat template cannot render a {role!r} "
                             f"message after an assistant turn ({type(exc).__name__}: {exc}); use 'chatml' "
                             "or 'llama3'") from exc
        eos = getattr(tokenizer, "eos_token", None) or ""
        closing = before[before.rfind(said) + len(said):] if said in before else None
        if not after.startswith(before) or after.count(seen) != 1 or closing is None:
            raise ValueError("observation_template 'chat_template': the chat template re-renders earlier turns "
                             "when a message is added, so an observation cannot be appended as tokens; use "
                             "'chatml' or 'llama3'")
        if not eos or not closing.startswith(eos):
            raise ValueError(f"observation_template 'chat_template': the chat template closes an assistant turn "
                             f"with {closing!r}, which does not start with the eos token {eos!r} that ends "
                             "sampling; set the tokenizer's eos_token to the end-of-turn token")
        turn = after[len(before):]
        cut = turn.index(seen)
        return cls(closing[len(eos):] + turn[:cut], turn[cut + len(seen):])

    def render(self, observation: str) -> str:
        return f"{self.prefix}{observation}{self.suffix}"


@dataclass
class RolloutConfig:
    """Limits of one multi-turn episode.

    Two token budgets, one per turn and one per episode (docs/recipes.md, "Token budgets"): the
    per-turn one is the sampling config's ``max_new_tokens`` (the released agent harnesses'
    ``max_response_length``: one turn = one sample there); the per-episode ones are below. Every
    turn is capped by ``min(max_new_tokens, what is left of max_response_tokens, what is left of
    max_model_len)``.

    ``max_turns``: assistant turns per episode. ``max_model_len``: prompt + response tokens
    (the model's context). ``max_response_tokens``: assistant + observation tokens after the
    prompt, over the whole episode (Dr.BoT's episode-level "overlong" threshold and the default
    T_norm of seq-mean-token-sum-norm). ``max_observation_tokens``: an observation longer than
    this is cut (tail dropped).

    Sample layout (docs/design.md "Sample layouts: full and window"): ``step_context="full"``
    (default) grows one context per episode, with the budgets above. ``"window"``: every step is
    sampled from its own prompt, the environment's ``step_prompt(history_steps)`` (the task, the
    last ``history_steps`` steps, the current observation), and is one learner sample; each step
    is capped by ``min(max_new_tokens, max_model_len - len(step prompt))``, ``max_response_tokens``
    is no episode budget there (each sample's response is one action; it stays the default
    T_norm), and a step prompt over ``max_prompt_tokens`` (None = only ``max_model_len``), or one
    leaving less than ``min_generation_tokens`` of ``max_model_len``, ends the episode truncated
    with ``reached_max_length`` before that step (a first step's prompt that does not fit is a
    ValueError, as a full-layout prompt over ``max_model_len`` is).
    """

    max_turns: int = 4
    max_model_len: int = 1024
    max_response_tokens: int = 512
    max_observation_tokens: int = 256
    observation_template: str = "chatml"  # "chatml" | "llama3" | "chat_template" (ObservationTemplate.named)
    min_generation_tokens: int = 8  # stop cleanly when less than this is left in the budget
    step_context: str = "full"  # "full" | "window" (STEP_CONTEXTS)
    history_steps: int = 2  # window: earlier steps a step prompt shows (the released env.history_length)
    max_prompt_tokens: int | None = None  # window: the per-step prompt budget

    def __post_init__(self) -> None:
        problems = check_step_context(self.step_context, self.history_steps, self.max_prompt_tokens,
                                      self.max_model_len, self.min_generation_tokens)
        if problems:
            raise ValueError("RolloutConfig: " + "; ".join(problems))

    @property
    def window(self) -> bool:
        return self.step_context == "window"


@dataclass
class RolloutStats:
    """Timing/throughput counters of one ``run`` call.

    The agent-loop counters (docs/design.md "The agent loop") mean the same in both rollout
    modes: ``engine_idle_s`` is the time, between the first and the last turn of the call, with
    no generation request in the engine; ``tool_latencies_s`` one entry per env step (a timed-out
    step: the time waited); ``concurrent_episodes_*`` the live (unfinished) episodes over time.
    ``tool_timeouts`` / ``tool_calls_concurrent_max`` are 0 in ``turn_sync``, where env steps run
    one at a time and a timed-out one ends its episode (``step_timeouts``, 0 in ``async``, where it
    becomes an observation: ``tool_timeouts``); ``tool_calls_abandoned`` counts the calls of
    either whose thread was left running."""

    generation_time_s: float = 0.0
    env_time_s: float = 0.0
    generated_tokens: int = 0
    engine_calls: int = 0
    rollout_errors: int = 0  # episodes ended by an exception while building a turn
    engine_idle_s: float = 0.0
    tool_latencies_s: list[float] = field(default_factory=list)
    concurrent_episodes_max: int = 0
    concurrent_episodes_mean: float = 0.0
    tool_calls_concurrent_max: int = 0
    tool_timeouts: int = 0  # env steps that exceeded tool_timeout_s (async mode)
    tool_calls_abandoned: int = 0  # of those, calls whose thread was left running
    step_timeouts: int = 0  # env steps past step_timeout_s that ended their episode (turn_sync)
    reset_failures: int = 0  # tasks whose group was not sampled: an env.reset raised or timed out
    # a rollout mode's own counters (agent_program: agent_program_errors / _timeouts), reported as they are
    extra: dict[str, Any] = field(default_factory=dict)

    def loop_metrics(self) -> dict[str, float]:
        """The agent-loop counters as flat numbers (what ``LLMEnvRunner`` reports), ``extra`` included."""
        lat = np.asarray(self.tool_latencies_s, dtype=np.float64)
        q = (lambda p: float(np.percentile(lat, p))) if lat.size else (lambda p: 0.0)
        return {"engine_idle_s": float(self.engine_idle_s),
                "tool_latency_p50_s": q(50), "tool_latency_p95_s": q(95),
                "tool_latency_max_s": float(lat.max()) if lat.size else 0.0,
                "tool_calls": float(lat.size),
                "concurrent_episodes_max": float(self.concurrent_episodes_max),
                "concurrent_episodes_mean": float(self.concurrent_episodes_mean),
                "tool_calls_concurrent_max": float(self.tool_calls_concurrent_max),
                "tool_timeouts": float(self.tool_timeouts),
                "tool_calls_abandoned": float(self.tool_calls_abandoned),
                "step_timeouts": float(self.step_timeouts),
                "reset_failures": float(self.reset_failures),
                **{k: float(v) for k, v in self.extra.items()}}


@dataclass
class _Episode:
    uid: str
    env: ToolEnv
    segments: list[Segment]
    context: list[int]
    task: dict[str, Any] = field(default_factory=dict)
    texts: list[str] = field(default_factory=list)
    turns: int = 0
    response_tokens: int = 0
    done: bool = False
    truncated: bool = False
    reached_max_length: bool = False
    turn_hit_cap: list[bool] = field(default_factory=list)  # per turn: stopped at its token cap
    # per turn: the env's StepResult.reward (a turn whose step raised is the episode's last, so
    # the list is aligned with the turns and at most one shorter)
    env_rewards: list[float] = field(default_factory=list)
    error: str | None = None  # "<ExceptionType>: message" when a turn raised
    error_stage: str | None = None
    env_error: str | None = None  # repr of an exception raised by env.step (older key)
    step_prompts: list[list[int]] | None = None  # window layout: the prompt of every step taken or to take


def step_rewards_from_env(env_rewards: Sequence[float], turns: int, outcome: float) -> list[float]:
    """The trajectory's per-step rewards r_k from the rewards the environment paid per step.

    The environment pays its whole return through ``StepResult.reward`` (the outcome usually on
    the last step) and names the outcome part in ``episode_stats().outcome_reward``
    (docs/algorithms.md, Notation). The outcome is kept apart (``Trajectory.outcome_reward``),
    so it is taken off the last step:

        r_k = env_k (k < K-1),   r_{K-1} = env_{K-1} - outcome,   R = outcome + sum_k r_k = sum_k env_k

    A turn whose env step raised paid nothing (0). A text game's invalid-action penalty is thus
    the step reward of the turn that made it, for SPA and GiGPO alike, and part of R.
    """
    if turns <= 0:
        return []
    r = [float(x) for x in env_rewards][:turns]
    r += [0.0] * (turns - len(r))
    r[-1] -= float(outcome)  # exactly 0 when the outcome alone was paid on the last step
    return r


def _describe(exc: BaseException) -> str:
    return safe_text(f"{type(exc).__name__}: {exc}")


class MultiTurnRollout:
    """Runs groups of G episodes per task with one batched engine call per turn.

    ``step_timeout_s``: the env-step watchdog (see the module doc); None runs the steps in the
    caller's thread with no limit."""

    def __init__(
        self,
        engine: GenerationEngine,
        tokenizer: Any,
        env_factory: Callable[[], ToolEnv],
        sampling: SamplingConfig,
        config: RolloutConfig | None = None,
        *,
        step_timeout_s: float | None = DEFAULT_STEP_TIMEOUT_S,
    ) -> None:
        self.step_timeout_s = _check_timeout("step_timeout_s", step_timeout_s)
        self._step_pool: ToolPool | None = None  # made on the first watched step
        self._reset_pool: ToolPool | None = None  # made on the first watched reset
        self._reset_pool_lock = threading.Lock()
        self.last_reset_error: str | None = None  # the last env.reset that failed a task's group
        # envs whose timed-out step still runs: never read (episode_stats) nor reused
        self._abandoned_envs: set[int] = set()
        self.engine = engine
        self.tokenizer = tokenizer
        self.env_factory = env_factory
        self.sampling = sampling
        self.config = config or RolloutConfig()
        self.obs_template = ObservationTemplate.named(self.config.observation_template, tokenizer)
        self._env_pool: list[ToolEnv] = []
        self._running: list[_Episode] = []  # the episodes of the run in progress (episodes_done)
        eos = tokenizer.eos_token_id
        if eos is not None and eos not in self.sampling.stop_token_ids:
            self.sampling.stop_token_ids = [*self.sampling.stop_token_ids, int(eos)]
        if self.config.window:  # refuse an env without the per-step prompt now, not mid-batch
            env = env_factory()
            require_step_prompt(env)
            self._env_pool.append(env)

    def episodes_done(self) -> tuple[int, int]:
        """(episodes finished, episodes) of the ``run`` in progress or last run: what the
        sampling heartbeat (env_runners/heartbeat.py) reads, from its own thread."""
        running = self._running
        return sum(1 for ep in running if ep.done), len(running)

    # -- env pool: environments are reused across calls (they may hold retrievers/sandboxes)
    def _acquire_env(self) -> ToolEnv:
        return self._env_pool.pop() if self._env_pool else self.env_factory()

    def _release_env(self, env: ToolEnv) -> None:
        if id(env) in self._abandoned_envs:  # a timed-out step may still change it: dropped
            self._abandoned_envs.discard(id(env))
            return
        self._env_pool.append(env)

    def _prompt_ids(self, messages: list[dict[str, str]], tools: list[dict] | None = None) -> list[int]:
        messages = [
            {**m, "content": safe_text(m["content"])} if isinstance(m, dict) and "content" in m else m
            for m in messages
        ]
        # an env's optional ``tool_schemas`` (code_math's retool format) reach the template's tools block
        extra = {"tools": tools} if tools else {}
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, **extra
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # BatchEncoding in some versions
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    def run(
        self, tasks: Sequence[dict[str, Any]], group_size: int, policy_version: int = 0
    ) -> tuple[list[Trajectory], RolloutStats]:
        """Sample ``group_size`` episodes for every task; returns finished trajectories in
        task order (all G of a task share the task's ``uid``)."""
        stats = RolloutStats()
        episodes = self._running = self._start_episodes(tasks, group_size, stats)
        t_loop, live_time = time.perf_counter(), 0.0
        live = [ep for ep in episodes if not ep.done]  # (a window episode may fail at its first prompt)
        stats.concurrent_episodes_max = len(live)
        while live:
            t_turn = time.perf_counter()
            caps = [self._generation_cap(ep) for ep in live]
            t0 = time.perf_counter()
            outs = self.engine.generate([ep.context for ep in live], self.sampling, caps)
            stats.generation_time_s += time.perf_counter() - t0
            stats.engine_calls += 1
            t0 = time.perf_counter()
            for ep, out in zip(live, outs):
                self._consume(ep, out, stats)
            stats.env_time_s += time.perf_counter() - t0
            live_time += len(live) * (time.perf_counter() - t_turn)
            live = [ep for ep in live if not ep.done]
        loop_s = time.perf_counter() - t_loop
        # the engine works only inside generate: every other moment of the loop it idles
        stats.engine_idle_s = max(0.0, loop_s - stats.generation_time_s)
        stats.concurrent_episodes_mean = live_time / loop_s if loop_s > 0 else 0.0

        trajs = [self._finish(ep, policy_version) for ep in episodes]
        return trajs, stats

    def _start_episodes(self, tasks: Sequence[dict[str, Any]], group_size: int,
                        stats: RolloutStats) -> list[_Episode]:
        """Reset ``group_size`` environments per task and tokenize their prompts (task order)."""
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        cfg = self.config
        episodes: list[_Episode] = []
        t0 = time.perf_counter()
        for task in tasks:
            uid = str(task.get("uid", uuid.uuid4().hex))
            try:
                started = self._reset_group(task, group_size, stats)
            except Exception as exc:  # noqa: BLE001 - one task's environment must not end the batch
                stats.reset_failures += 1
                self.last_reset_error = f"task {uid}: {_describe(exc)}"
                logger.warning("env.reset failed, task %s is not sampled (counted in reset_failures): %s",
                               uid, _describe(exc))
                continue
            for env, messages in started:
                prompt = self._prompt_ids(messages, getattr(env, "tool_schemas", None))
                if cfg.window:  # the episode's prompt is a segment only; the engine reads the step's
                    episodes.append(self._window_episode(uid, env, prompt, task, stats))
                    continue
                if len(prompt) + cfg.min_generation_tokens > cfg.max_model_len:
                    raise ValueError(
                        f"task {uid}: prompt has {len(prompt)} tokens, more than "
                        f"max_model_len={cfg.max_model_len} allows; raise max_model_len"
                    )
                episodes.append(_Episode(uid, env, [Segment("prompt", prompt)], list(prompt), task))
        stats.env_time_s += time.perf_counter() - t0
        return episodes

    def _window_episode(self, uid: str, env: ToolEnv, prompt: list[int], task: dict[str, Any],
                        stats: RolloutStats) -> _Episode:
        """A window-layout episode: ``prompt`` (the reset messages) opens its segments, its first
        step's prompt (``env.step_prompt``) is the engine's context. A first step prompt that does
        not fit the budgets is a ValueError (a config problem, as a full prompt over max_model_len)."""
        ep = _Episode(uid, env, [Segment("prompt", prompt)], [], task, step_prompts=[])
        try:
            first = self._step_prompt_ids(env)
        except Exception as exc:  # a broken hook ends this episode only (no step taken)
            self._fail(ep, "step_prompt", exc, stats)
            return ep
        if self._prompt_over_budget(len(first)):
            cfg = self.config
            raise ValueError(f"task {uid}: the first step prompt has {len(first)} tokens, more than max_prompt_tokens="
                             f"{cfg.max_prompt_tokens} / max_model_len={cfg.max_model_len} (minus min_generation_tokens="
                             f"{cfg.min_generation_tokens}) allow; raise .env_runners(max_prompt_tokens=..., max_model_len=...)")
        ep.context = list(first)
        ep.step_prompts.append(first)
        return ep

    def _step_prompt_ids(self, env: ToolEnv) -> list[int]:
        """The tokenized prompt of ``env``'s next step (window layout)."""
        return self._prompt_ids(env.step_prompt(int(self.config.history_steps)), getattr(env, "tool_schemas", None))

    def _prompt_over_budget(self, n: int) -> bool:
        """Window layout: a step prompt of ``n`` tokens leaves no room for its step."""
        cfg = self.config
        if cfg.max_prompt_tokens is not None and n > cfg.max_prompt_tokens:
            return True
        return cfg.max_model_len - n < cfg.min_generation_tokens

    def _reset_group(self, task: dict[str, Any], group_size: int,
                     stats: RolloutStats) -> list[tuple[ToolEnv, Any]]:
        """``group_size`` environments reset on ``task``: (env, first messages) each. A reset
        that raises, or (``step_timeout_s``) still runs after that long, fails the whole group
        (a partial group would bias its baseline): the envs reset so far go back to the pool,
        a timed-out one is dropped (its call still owns it)."""
        envs: list[ToolEnv] = []
        started: list[tuple[ToolEnv, Any]] = []
        try:
            for _ in range(group_size):
                envs.append(self._acquire_env())
                started.append((envs[-1], self._reset_env(envs[-1], task, stats)))
        except BaseException:
            for env in envs:  # _release_env drops a timed-out one
                self._release_env(env)
            raise
        return started

    def _reset_env(self, env: ToolEnv, task: dict[str, Any], stats: RolloutStats) -> Any:
        """``env.reset(task)``, under the step watchdog when ``step_timeout_s`` is set."""
        limit = self.step_timeout_s
        if limit is None:
            return env.reset(task)
        with self._reset_pool_lock:  # the async loop resets groups from several executor threads
            if self._reset_pool is None:
                self._reset_pool = ToolPool(4, name="env-reset")
        return self._watched(self._reset_pool, env, env.reset, task, stats,
                             "env.reset", "the task's group is not sampled")

    def _watched(self, pool: ToolPool, env: ToolEnv, fn: Callable[[Any], Any], arg: Any, stats: RolloutStats,
                 what: str, outcome: str) -> Any:
        """``fn(arg)`` on ``pool`` for at most ``step_timeout_s``; past it the call is abandoned,
        counted (``step_timeouts``, ``tool_calls_abandoned``), ``env`` is never read nor reused
        again, and :class:`EnvStepTimeout` says what happens (``outcome``)."""
        limit = self.step_timeout_s
        call = pool.call(fn, arg, timeout=limit)
        if call.abandoned:
            stats.step_timeouts += 1
            stats.tool_calls_abandoned += 1
            self._abandoned_envs.add(id(env))
            raise EnvStepTimeout(f"{what} still running after step_timeout_s={limit:g} s: {outcome} and its "
                                 "environment is dropped (raise .env_runners(step_timeout_s=...) if healthy calls "
                                 "take this long; None = no limit)")
        return call.result()

    def _generation_cap(self, ep: _Episode) -> int:
        cfg = self.config
        left_ctx = cfg.max_model_len - len(ep.context)
        if cfg.window:  # the context is this step's prompt; max_response_tokens is no episode budget
            return max(1, min(self.sampling.max_new_tokens, left_ctx))
        left_resp = cfg.max_response_tokens - ep.response_tokens
        return max(1, min(self.sampling.max_new_tokens, left_ctx, left_resp))

    def _fail(self, ep: _Episode, stage: str, exc: BaseException, stats: RolloutStats) -> None:
        """End ``ep`` as an errored, truncated episode (never re-raises)."""
        ep.done, ep.truncated = True, True
        if ep.error is None:
            ep.error, ep.error_stage = _describe(exc), stage
            stats.rollout_errors += 1

    def _consume(self, ep: _Episode, out: GenerationOutput, stats: RolloutStats) -> None:
        """Append one assistant turn (and the observation after it) to ``ep``.

        Any exception ends only this episode (``_fail``); state is committed only after every
        step that may raise has succeeded, so the segments stay consistent. The three pieces
        (:meth:`_take_turn`, the env step, :meth:`_take_step`) are shared with the async loop
        (env_runners/async_rollout.py), which runs the env step on a worker thread."""
        text = self._take_turn(ep, out, stats)
        if text is None:
            return
        t0 = time.perf_counter()
        try:
            res = self._step_env(ep, text, stats)
        except Exception as exc:  # environments must not crash a run; record and end it
            ep.env_error = repr(exc)
            self._fail(ep, "env_step", exc, stats)
            return
        finally:
            stats.tool_latencies_s.append(time.perf_counter() - t0)
        self._take_step(ep, res, stats)

    def _step_env(self, ep: _Episode, text: str, stats: RolloutStats) -> StepResult:
        """``ep.env.step(text)``, on the watchdog's worker when ``step_timeout_s`` is set; raises
        :class:`EnvStepTimeout` (counted, the env dropped) for a step past it."""
        limit = self.step_timeout_s
        if limit is None:
            return ep.env.step(text)
        if self._step_pool is None:  # one thread: the turn_sync loop steps one env at a time
            self._step_pool = ToolPool(1, name="env-step")
        return self._watched(self._step_pool, ep.env, ep.env.step, text, stats,
                             "env step", "the episode ends here")

    def _take_turn(self, ep: _Episode, out: GenerationOutput, stats: RolloutStats) -> str | None:
        """Append the sampled assistant turn to ``ep``; returns its decoded text for the env, or
        None when the episode failed here (stages ``engine_output``, ``decode``)."""
        stage = "engine_output"
        try:
            ids = [int(t) for t in out.token_ids]
            version = getattr(out, "policy_version", None)  # engines that stamp it (base.py)
            seg = Segment("assistant", ids, [float(x) for x in out.logprobs], step=ep.turns,
                          policy_version=None if version is None else int(version))
            # stopped at its cap (max_new_tokens or the episode's budget left), not at a stop
            # token: the per-turn "overlong" of the released agent code
            hit_cap = out.finish_reason == "length"
        except Exception as exc:  # a malformed engine output for this sequence only
            self._fail(ep, stage, exc, stats)
            return None
        ep.segments.append(seg)
        ep.context.extend(ids)
        ep.response_tokens += len(ids)
        ep.turns += 1
        ep.turn_hit_cap.append(hit_cap)
        stats.generated_tokens += len(ids)
        try:
            stage = "decode"
            text = safe_text(self.tokenizer.decode(ids, skip_special_tokens=True))
            ep.texts.append(text)
        except Exception as exc:
            self._fail(ep, stage, exc, stats)
            return None
        return text

    def _take_step(self, ep: _Episode, res: StepResult, stats: RolloutStats) -> None:
        """Record what the env step returned: its reward, the end of the episode, or the
        observation segment (stages ``reward``, ``observation``; the context budget)."""
        stage = "reward"
        try:
            ep.env_rewards.append(float(res.reward))
            if res.done or res.observation is None:
                ep.done = True
                return
            if ep.turns >= self.config.max_turns:
                ep.done, ep.truncated = True, True
                return
            stage = "observation"
            obs_ids = self._observation_ids(res.observation)
        except Exception as exc:
            self._fail(ep, stage, exc, stats)
            return
        cfg = self.config
        if cfg.window:
            self._next_window_step(ep, obs_ids, stats)
            return
        room_ctx = cfg.max_model_len - (len(ep.context) + len(obs_ids))
        room_resp = cfg.max_response_tokens - (ep.response_tokens + len(obs_ids))
        if min(room_ctx, room_resp) < cfg.min_generation_tokens:
            # Context budget: stop before exceeding the model's length; flagged truncated.
            ep.done, ep.truncated, ep.reached_max_length = True, True, True
            return
        ep.segments.append(Segment("observation", obs_ids, None, step=ep.turns - 1))
        ep.context.extend(obs_ids)
        ep.response_tokens += len(obs_ids)

    def _next_window_step(self, ep: _Episode, obs_ids: list[int], stats: RolloutStats) -> None:
        """Window layout: the observation joins the episode's segments (not the context) and the
        next step's prompt becomes the context; a prompt over the budget ends the episode
        truncated (``reached_max_length``) before that step."""
        try:
            prompt = self._step_prompt_ids(ep.env)
        except Exception as exc:
            self._fail(ep, "step_prompt", exc, stats)
            return
        if self._prompt_over_budget(len(prompt)):
            ep.done, ep.truncated, ep.reached_max_length = True, True, True
            return
        ep.segments.append(Segment("observation", obs_ids, None, step=ep.turns - 1))
        ep.response_tokens += len(obs_ids)
        ep.context = list(prompt)
        ep.step_prompts.append(prompt)

    def _observation_ids(self, observation: Any) -> list[int]:
        """Tokens of the observation wrapped by the template (tail cut to the budget)."""
        cfg = self.config
        rendered = self.obs_template.render(safe_text(observation))
        obs_ids = [int(t) for t in self.tokenizer.encode(rendered, add_special_tokens=False)]
        if len(obs_ids) > cfg.max_observation_tokens:
            # Keep the template suffix (next assistant header) so the format stays valid.
            suffix = [int(t) for t in self.tokenizer.encode(self.obs_template.suffix,
                                                             add_special_tokens=False)]
            obs_ids = obs_ids[: cfg.max_observation_tokens - len(suffix)] + suffix
        return obs_ids

    def _episode_stats(self, ep: _Episode) -> Any:
        """What the episode's environment reports; an environment whose timed-out step still
        runs is not read (the async loop adds its own check for its abandoned tool calls)."""
        if id(ep.env) in self._abandoned_envs:
            raise EnvStepTimeout(f"an env step ran past step_timeout_s={self.step_timeout_s:g} s; its environment "
                                 "cannot be read safely")
        return ep.env.episode_stats()

    def _finish(self, ep: _Episode, policy_version: int, *, keep_stamps: bool = False) -> Trajectory:
        """The episode's ``Trajectory``; its assistant segments record ``policy_version`` (the
        runner's weights during the call: no update can land in one). ``keep_stamps`` (a
        stream, whose weights change under it): each segment keeps the version the engine
        stamped on it (``GenerationOutput.policy_version``), ``policy_version`` fills the
        unstamped ones, and the trajectory's version is the oldest (partial rollouts)."""
        versions = []
        for seg in ep.segments:
            if seg.kind == "assistant":
                if seg.policy_version is None or not keep_stamps:
                    seg.policy_version = int(policy_version)
                versions.append(seg.policy_version)
        source = type(ep.env).__name__
        try:
            stats = EpisodeStats.coerce(self._episode_stats(ep), source)
        except EpisodeStatsError:
            raise
        except Exception as exc:  # a broken env must not lose the batch either
            # The episode failed: its record says so (no success, no answer, no calls counted).
            stats = EpisodeStats(success=False, outcome_reward=float(sum(ep.env_rewards)), tool_calls=0,
                                 queries_per_step=[], format_ok=False, has_answer=False)
            ep.truncated = True
            if ep.error is None:
                ep.error, ep.error_stage = _describe(exc), "episode_stats"
        # window layout: no episode budget (each sample's response is one step)
        reached = ep.reached_max_length or (not self.config.window
                                            and is_overlong(ep.response_tokens, self.config.max_response_tokens))
        # window layout: one prompt per step taken (a prompt whose step failed is dropped)
        prompts = None if ep.step_prompts is None else ep.step_prompts[:ep.turns]
        record = RolloutRecord(turns=ep.turns, assistant_texts=list(ep.texts), reached_max_length=bool(reached),
                               turn_hit_cap=list(ep.turn_hit_cap), error=ep.error, error_stage=ep.error_stage,
                               env_error=ep.env_error)
        self._release_env(ep.env)
        return Trajectory(
            uid=ep.uid, segments=ep.segments, outcome_reward=stats.outcome_reward,
            step_rewards=step_rewards_from_env(ep.env_rewards, ep.turns, stats.outcome_reward),
            policy_version=min(versions, default=int(policy_version)),
            truncated=ep.truncated, stats=stats, rollout=record, task=dict(ep.task),
            traj_id=uuid.uuid4().hex, step_prompts=prompts,
        )
