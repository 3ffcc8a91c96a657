"""The agent-program rollout (``rollout_mode="agent_program"``): each episode runs the user's
program against the runner's OpenAI endpoint (docs/design.md "The OpenAI endpoint").

For every episode of a call (G per task): an :class:`~rllib_spear.envs.agent_program.AgentProgramEnv`
from the runner's env pool is reset on the task, an episode is opened on the endpoint
(serving/endpoint.py: its own base URL, its sampling, its request seeds), and the program runs
with an ``openai`` client pointed there, as one coroutine per episode on the process's agent loop
(env_runners/event_loop.py), which runs the program apart: an ``async def`` program on the
process's program loop (a thread of its own, :func:`_program_loop`) with an ``AsyncOpenAI``, a
plain one on a worker thread of the rollout's pool with an ``OpenAI``. The server and the engine
stay on the agent loop, so a program that blocks cannot stall them; every client of a kind shares
one connection pool. Every episode is a member of the engine's batching while
it runs (``GenerationEngine.batching_member``), so the HF engine's scheduler closes a batch as
soon as every running episode waits in it, as in the async agent loop.

When the program returns (or raises, or runs past ``episode_timeout_s``: a failed episode,
reward 0, counted in ``agent_program_errors`` / ``agent_program_timeouts``), the episode is closed
on the endpoint and its captured calls become the trajectory (core/call_layout.py: one context
when the calls chain, else one sample per call), with the program's reward as the outcome.

The rollout has the interface of the async agent loop: ``run(tasks, group_size,
policy_version)`` for a sampling call and ``arun_group`` for the fully asynchronous pipeline's
stream (env_runners/rollout_stream.py); ``sampling`` / ``config`` / ``env_factory`` as the other
rollouts. Seeds: the request of call c of the episode with index i of a call seeded s has seed
``request_seed(s, i, c)`` (async_rollout.request_seed).

Sampling (serving/protocol.py): a request may repeat the training temperature or leave it out;
when the rollout samples with other parameters than it was built with (the runner's evaluation
sets eval_temperature / eval_top_p), the episode's requests sample with those whatever they ask.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
import uuid
import weakref
from typing import Any, Callable, Sequence

from ..core.call_layout import call_segments
from ..core.episode import EpisodeStats, RolloutRecord
from ..core.filters import is_overlong
from ..core.trajectory import Trajectory
from ..envs.agent_program import AgentProgramEnv, ProgramOutcome, program_reward
from .async_rollout import _Run
from .engines.base import GenerationEngine, SamplingConfig
from .rollout import RolloutConfig, RolloutStats, _describe
from .tool_pool import ToolPool

__all__ = ["AgentProgramRollout", "AGENT_PROGRAM_METRICS"]

log = logging.getLogger(__name__)

#: The counters this rollout adds to ``RolloutStats.extra`` (summed over calls by the runner).
AGENT_PROGRAM_METRICS = ("agent_program_errors", "agent_program_timeouts")


@dataclasses.dataclass
class _ProgramEpisode:
    uid: str
    env: AgentProgramEnv
    task: dict[str, Any]
    index: int


class AgentProgramRollout:
    """Runs agent programs as episodes (see the module doc).

    Args:
        engine: the runner's engine (the endpoint samples with it).
        tokenizer: its tokenizer (decoded texts, the empty-episode prompt).
        env_factory: builds :class:`AgentProgramEnv` instances.
        sampling: the training sampling parameters (eos is added to its stop tokens).
        config: the context budget (``max_model_len``, ``min_generation_tokens``) and
            ``max_response_tokens`` (the full layout's overlong threshold).
        endpoint: the runner's started ``OpenAIEndpoint``; None starts one of its own (on
            localhost, with the defaults of ``serve_openai=True``) on first use, stopped by
            :meth:`shutdown`.
        tool_concurrency: worker threads of plain-``def`` programs (None: one per episode).
    """

    def __init__(self, engine: GenerationEngine, tokenizer: Any, env_factory: Callable[[], AgentProgramEnv],
                 sampling: SamplingConfig, config: RolloutConfig | None = None, *, endpoint: Any = None,
                 tool_concurrency: int | None = None) -> None:
        self.engine, self.tokenizer, self.env_factory = engine, tokenizer, env_factory
        self.sampling = sampling
        self.config = config or RolloutConfig()
        eos = tokenizer.eos_token_id
        if eos is not None and eos not in self.sampling.stop_token_ids:
            self.sampling.stop_token_ids = [*self.sampling.stop_token_ids, int(eos)]
        self._trained = self._sampling_key(self.sampling)
        self.endpoint, self._own_endpoint = endpoint, endpoint is None
        self.tool_concurrency = tool_concurrency
        self._env_pool: list[AgentProgramEnv] = []
        self._env_lock = threading.Lock()
        self._pool: ToolPool | None = None
        self._pool_lock = threading.Lock()
        self._pool_demand = 0
        self._progress = [0, 0]  # (episodes finished, episodes) of the run in progress (episodes_done)
        env = env_factory()  # refuse another environment now, not mid-batch
        if not isinstance(env, AgentProgramEnv):
            raise ValueError(f"rollout_mode='agent_program' runs AgentProgramEnv episodes, not {type(env).__name__}; "
                             "use .environment('agent_program', env_config={'program': ...}), or another rollout_mode")
        self._env_pool.append(env)

    # ------------------------------------------------------------------ resources
    @staticmethod
    def _sampling_key(s: SamplingConfig) -> tuple:
        return (s.temperature, s.top_p, s.top_k, s.max_new_tokens)

    def _endpoint(self) -> Any:
        if self.endpoint is None:
            from .serving import OpenAIEndpoint

            self.endpoint = OpenAIEndpoint(self.engine, self.tokenizer, self.sampling,
                                           max_model_len=self.config.max_model_len,
                                           min_generation_tokens=self.config.min_generation_tokens).start()
            weakref.finalize(self, self.endpoint.stop)
        return self.endpoint

    def shutdown(self) -> None:
        """Stop an endpoint this rollout started and its worker threads."""
        if self._own_endpoint and self.endpoint is not None:
            self.endpoint.stop()
            self.endpoint = None
        if self._pool is not None:
            self._pool.shutdown()

    def _acquire_env(self) -> AgentProgramEnv:
        with self._env_lock:
            if self._env_pool:
                return self._env_pool.pop()
        return self.env_factory()

    def _release_env(self, env: AgentProgramEnv) -> None:
        with self._env_lock:
            self._env_pool.append(env)

    def _acquire_pool(self, episodes: int) -> ToolPool:
        with self._pool_lock:
            self._pool_demand += episodes
            size = self.tool_concurrency or max(1, self._pool_demand)
            if self._pool is None:
                self._pool = ToolPool(size, name="agent-program")
                weakref.finalize(self, self._pool.shutdown)
            else:
                self._pool.grow(size)
            return self._pool

    def _release_pool(self, episodes: int) -> None:
        with self._pool_lock:
            self._pool_demand -= episodes

    # ------------------------------------------------------------------ the rollout interface
    def episodes_done(self) -> tuple[int, int]:
        """(episodes finished, episodes) of the ``run`` in progress or last run (the sampling
        heartbeat, env_runners/heartbeat.py, reads it from its own thread)."""
        done, total = self._progress
        return done, total

    def run(self, tasks: Sequence[dict[str, Any]], group_size: int,
            policy_version: int = 0) -> tuple[list[Trajectory], RolloutStats]:
        """``group_size`` episodes of every task, concurrently; trajectories in task order."""
        from .event_loop import run_on_agent_loop

        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        stats = RolloutStats()
        episodes = [_ProgramEpisode(str(t.get("uid", uuid.uuid4().hex)), self._acquire_env(), dict(t), i * group_size + g)
                    for i, t in enumerate(tasks) for g in range(group_size)]
        self._endpoint()
        self._progress = [0, len(episodes)]
        pool = self._acquire_pool(len(episodes))
        run = _Run(stats, pool)
        t0 = time.perf_counter()
        try:
            trajs = run_on_agent_loop(self._episodes(episodes, run, self.sampling.seed, policy_version, False))
        finally:
            run.close_window(time.perf_counter() - t0)
            self._release_pool(len(episodes))
        return trajs, stats

    async def arun_group(self, task: dict[str, Any], group_size: int, seed: int | None, run: _Run,
                         policy_version: int = 0) -> list[Trajectory]:
        """The ``group_size`` episodes of one task on a stream's ``run`` (rollout_stream.py)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._endpoint)
        uid = str(task.get("uid", uuid.uuid4().hex))
        episodes = [_ProgramEpisode(uid, self._acquire_env(), dict(task), g) for g in range(group_size)]
        return await self._episodes(episodes, run, seed, policy_version, True)

    async def _episodes(self, episodes: list[_ProgramEpisode], run: _Run, seed: int | None,
                        policy_version: int, keep_stamps: bool) -> list[Trajectory]:
        """Run the episodes concurrently; their trajectories in order. The assistant segments
        record ``policy_version`` (the runner's weights during a ``run`` call: no update lands in
        one), or with ``keep_stamps`` (a stream, whose weights change under it) the version the
        engine stamped on each call, ``policy_version`` where it stamped none."""
        members = [self._batching_member() for _ in episodes]
        for m in members:  # every episode is a member before any of them calls (async_rollout.py)
            m.__enter__()
        try:
            return list(await asyncio.gather(*[self._episode(ep, run, seed, policy_version, keep_stamps, m)
                                               for ep, m in zip(episodes, members)]))
        finally:
            for m in members:
                m.__exit__(None, None, None)

    def _batching_member(self) -> Any:
        member = getattr(self.engine, "batching_member", None)
        return _Once(member() if member is not None else contextlib.nullcontext())

    # ------------------------------------------------------------------ one episode
    async def _episode(self, ep: _ProgramEpisode, run: _Run, seed: int | None, policy_version: int,
                       keep_stamps: bool, member: "_Once") -> Trajectory:
        from .serving.protocol import SamplingPolicy

        endpoint = self._endpoint()
        sampling = dataclasses.replace(self.sampling)
        evaluation = self._sampling_key(sampling) != self._trained
        policy = SamplingPolicy(sampling, trained_temperature=self._trained[0], evaluation=evaluation,
                                max_model_len=int(self.config.max_model_len),
                                min_generation_tokens=int(self.config.min_generation_tokens))
        capture = endpoint.open_episode(policy, seed=seed, index=ep.index, engine_gauge=run.engine)
        env = ep.env
        error, timed_out, reward = None, False, 0.0
        try:
            with run.live:
                try:
                    env.reset(ep.task)
                    with run.tools:
                        value, error, timed_out = await self._run_program(env, ep.task, endpoint, capture, run)
                    if error is None:
                        reward = program_reward(value)
                except Exception as exc:  # noqa: BLE001 - a program must not crash a runner
                    error = _describe(exc)
        finally:  # also when the group is cancelled (a stream that stops): no episode stays open
            member.__exit__(None, None, None)
            records = endpoint.close_episode(capture)
        self._progress[0] += 1
        if error is not None:
            reward = 0.0
            run.stats.rollout_errors += 1
            key = "agent_program_timeouts" if timed_out else "agent_program_errors"
            run.stats.extra[key] = run.stats.extra.get(key, 0) + 1
        for name in AGENT_PROGRAM_METRICS:  # every call reports both (0 included)
            run.stats.extra.setdefault(name, 0)
        env.record(ProgramOutcome(reward, error, timed_out, tuple(r.tool_calls for r in records),
                                  sum(r.malformed_tool_calls for r in records)))
        return self._trajectory(ep, records, capture.context_refusals, error, timed_out, policy_version, keep_stamps,
                                run.stats)

    async def _run_program(self, env: AgentProgramEnv, task: dict[str, Any], endpoint: Any, capture: Any,
                           run: _Run) -> tuple[Any, str | None, bool]:
        """(what the program returned, its error or None, whether it timed out). The timeout is
        kept here, on the agent loop, so that it fires even while a program blocks its own loop."""
        timeout = env.episode_timeout_s
        timed_out = f"AgentProgramTimeout: the program ran past episode_timeout_s={timeout:g} s"
        if env.is_async:
            loop, http = _program_loop()
            client = _async_client(endpoint, capture, timeout, http)
            fut = asyncio.run_coroutine_threadsafe(env.program(task, client), loop)
            try:
                return await asyncio.wait_for(asyncio.wrap_future(fut), timeout), None, False
            except asyncio.TimeoutError:  # wait_for cancelled it (on its loop, once that loop runs)
                return None, timed_out, True
            except asyncio.CancelledError:
                fut.cancel()
                raise
            except Exception as exc:  # noqa: BLE001 - the program's own failure
                return None, _describe(exc), False
        call = run.pool.submit(env.program, task, endpoint.client(capture, timeout=timeout))
        try:
            finished = await call.finish(timeout)
        except asyncio.CancelledError:
            run.pool.cancel(call)
            raise
        if not finished and run.pool.abandon(call):
            return None, timed_out, True  # its later calls are 404s: the episode is closed next
        if not call.done:
            await call.finish(None)
        try:
            return call.result(), None, False
        except Exception as exc:  # noqa: BLE001
            return None, _describe(exc), False

    def _trajectory(self, ep: _ProgramEpisode, records: list, context_refusals: int, error: str | None,
                    timed_out: bool, policy_version: int, keep_stamps: bool, stats: RolloutStats) -> Trajectory:
        calls = [r.call for r in records]
        empty = [self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else 0]
        segments, step_prompts = call_segments(calls, empty)
        for seg in segments:
            if seg.kind == "assistant" and (seg.policy_version is None or not keep_stamps):
                seg.policy_version = int(policy_version)
        versions = [s.policy_version for s in segments if s.kind == "assistant"]
        env_stats = EpisodeStats.coerce(ep.env.episode_stats(), type(ep.env).__name__)
        texts = [self.tokenizer.decode(list(c.completion_ids), skip_special_tokens=True) for c in calls]
        hit_cap = [r.finish_reason == "length" for r in records]  # the per-turn "overlong"
        stats.engine_calls += len(calls)
        stats.generated_tokens += sum(len(c.completion_ids) for c in calls)
        traj = Trajectory(uid=ep.uid, segments=segments, outcome_reward=env_stats.outcome_reward,
                          step_rewards=[0.0] * len(calls), policy_version=min(versions, default=int(policy_version)),
                          truncated=error is not None, stats=env_stats, task=dict(ep.task),
                          traj_id=uuid.uuid4().hex, step_prompts=step_prompts)
        overlong = context_refusals > 0 or (step_prompts is None and calls
                                            and is_overlong(traj.response_length, self.config.max_response_tokens))
        traj.rollout = RolloutRecord(turns=len(calls), assistant_texts=texts, reached_max_length=bool(overlong),
                                     turn_hit_cap=hit_cap, error=error,
                                     error_stage=None if error is None else
                                     ("agent_program_timeout" if timed_out else "agent_program"))
        self._release_env(ep.env)
        return traj


class _Once:
    """A context manager exited at most once (an episode leaves the engine's batching as soon as
    its program ends, and again, harmlessly, when the group finishes)."""

    def __init__(self, cm: Any) -> None:
        self.cm, self.entered, self.exited = cm, False, False

    def __enter__(self) -> "_Once":
        self.cm.__enter__()
        self.entered = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.entered and not self.exited:
            self.exited = True
            self.cm.__exit__(None, None, None)


_program_lock = threading.Lock()
_program: tuple[asyncio.AbstractEventLoop, Any] | None = None


def _program_loop() -> tuple[asyncio.AbstractEventLoop, Any]:
    """The process's loop for ``async def`` programs (a daemon thread, started on first use) and
    the HTTP connection pool their clients share (made on that loop). Programs run apart from the
    agent loop, where the endpoint serves and the engine is awaited: a program that blocks its
    loop (a synchronous call inside an ``async def``) stalls the other programs, never the server
    or the engine, and its ``episode_timeout_s`` still fires."""
    global _program
    with _program_lock:
        if _program is None or not _program[0].is_running():
            import httpx

            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="rllib-spear-agent-programs", daemon=True).start()

            async def pool() -> Any:
                return httpx.AsyncClient(trust_env=False, limits=httpx.Limits(max_connections=None,
                                                                              max_keepalive_connections=256))

            _program = (loop, asyncio.run_coroutine_threadsafe(pool(), loop).result())
        return _program


def _async_client(endpoint: Any, capture: Any, timeout: float | None, http: Any) -> Any:
    """An ``openai.AsyncOpenAI`` for ``capture``'s calls over the program loop's pool ``http``."""
    import openai

    return openai.AsyncOpenAI(**endpoint.client_kwargs(capture), timeout=timeout, http_client=http)
