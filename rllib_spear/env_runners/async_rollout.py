"""The async agent loop (``rollout_mode="async"``): every episode runs at its own pace.

Each episode is one coroutine on the process's agent loop (env_runners/event_loop.py): it awaits
its next turn from the engine (``GenerationEngine.agenerate``: the HF engine's continuous-batching
scheduler, vLLM's ``AsyncLLM``), steps its environment on a worker thread of a bounded pool
(env_runners/tool_pool.py, ``tool_concurrency`` threads, never on the event loop), and goes on to
its next turn without waiting for the other episodes. docs/design.md "The agent loop" compares the
two modes.

Everything an episode records is built by the pieces of ``MultiTurnRollout`` (``_start_episodes``,
``_generation_cap``, ``_take_turn``, ``_take_step``, ``_finish``): token-in/token-out, loss masks,
behaviour log-probs, ``safe_text``, the error handling (a failing turn ends its episode alone) and
the ``Trajectory`` records are the turn-synchronous loop's. With an engine whose output depends
only on the prompt, both modes give the same trajectories; with a sampling engine they are
identically distributed (which requests share a batch depends on timing).

Seeds: every request carries its own seed, :func:`request_seed` of (the call's sampling seed,
episode index, turn), so a run is reproducible given the same engine outputs (what an engine does
with it: engines/batching.py, and ``VLLMEngine``'s ``per_request_seeds``).

Batching: each episode is a member of the engine's batching while it runs
(``GenerationEngine.batching_member``), so the engine can start a batch as soon as every running
episode waits for it rather than after a gather window.

Tool timeouts (``tool_timeout_s``, None = no limit). A step still running after ``tool_timeout_s``
(counted from when it started on a worker) becomes the observation ``"tool call timed out after
N s"`` (reward 0) and the episode goes on. The call is abandoned: its thread is left to finish
(``tool_calls_abandoned``). An environment holds one episode's state and is not thread-safe, so
the abandoned call still owns it: the episode's next env step first waits for it (that wait and
the new call share one ``tool_timeout_s``; if it is still running the new turn times out too and
its text never reaches the env). When the late call returns, its reward replaces the 0 of its turn
(the env's own accounting, ``episode_stats``, counted it); a late ``done`` ends the episode there
(the turn sampled after the timeout observation stays, never stepped); a late exception ends the
episode as an ``env_step`` error. An episode that ends while its abandoned call still runs waits up
to ``tool_timeout_s`` more; after that its env cannot be read safely: the trajectory is an
``episode_stats`` error (no success, as for an env whose ``episode_stats`` raised) and the env is
dropped from the pool, never reused. With ``step_context="window"`` a timed-out step ends its
episode as an ``env_step`` error instead: the next step's prompt comes from the environment
(``ToolEnv.step_prompt``), which the abandoned call still owns.

Window layout (``RolloutConfig.step_context="window"``, docs/design.md "Sample layouts: full and
window"): each request's context is the step's own prompt, as in the turn-synchronous loop (the
shared ``_take_turn`` / ``_take_step`` / ``_generation_cap`` do it).

Stats (``RolloutStats``): ``generation_time_s`` is the time with at least one request in the
engine and ``engine_idle_s`` the rest of the loop's span; ``env_time_s`` is the resets plus the
time with at least one env step running; ``engine_calls`` counts requests (one per turn).
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from ..core.trajectory import Trajectory
from ..envs.base import StepResult, ToolEnv
from .engines.base import GenerationEngine, SamplingConfig
from .event_loop import run_on_agent_loop
from .rollout import MultiTurnRollout, RolloutConfig, RolloutStats, _Episode
from .tool_pool import ToolCall, ToolPool

__all__ = ["AsyncMultiTurnRollout", "DEFAULT_TOOL_TIMEOUT_S", "ToolCallStillRunning", "request_seed",
           "timeout_observation"]

#: Generous: no healthy tool comes near it (the code sandbox caps a cell at 30 s on its own), so
#: it changes no result, yet a hung call (a dead HTTP endpoint) cannot stall a run forever.
DEFAULT_TOOL_TIMEOUT_S = 300.0


def request_seed(seed: int | None, episode: int, turn: int) -> int | None:
    """The sampling seed of one request: a function of (the call's sampling seed, the episode's
    index in the call, the turn), 63 bits; None when the call has no seed."""
    if seed is None:
        return None
    state = np.random.SeedSequence([int(seed) % 2**64, int(episode), int(turn)]).generate_state(1, np.uint64)
    return int(state[0] >> np.uint64(1))


def timeout_observation(timeout_s: float) -> str:
    """What the model reads after a tool call that timed out."""
    return f"tool call timed out after {timeout_s:g} s"


class ToolCallStillRunning(RuntimeError):
    """An episode ended while a tool call it abandoned still ran on its environment."""


class _Gauge:
    """A count over time (requests in the engine, live episodes, env steps in flight): its
    maximum, the time it was above 0, and its time integral."""

    def __init__(self) -> None:
        self.count = self.max = 0
        self.busy_s = self.area = 0.0
        self._t = time.perf_counter()

    def _advance(self) -> None:
        now = time.perf_counter()
        if self.count:
            self.busy_s += now - self._t
            self.area += self.count * (now - self._t)
        self._t = now

    def __enter__(self) -> "_Gauge":
        self._advance()
        self.count += 1
        self.max = max(self.max, self.count)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._advance()
        self.count -= 1


class _Run:
    """The state shared by episode coroutines: of one ``run`` call, or of a stream's window
    between two takes (env_runners/rollout_stream.py)."""

    def __init__(self, stats: RolloutStats, pool: ToolPool) -> None:
        self.stats, self.pool = stats, pool
        self.engine, self.live, self.tools = _Gauge(), _Gauge(), _Gauge()
        self._marks = self._gauge_marks()

    def _gauge_marks(self) -> tuple[float, float, float]:
        return self.engine.busy_s, self.tools.busy_s, self.live.area

    def close_window(self, span: float) -> RolloutStats:
        """Fill ``stats``' loop counters for the ``span`` seconds since the window opened and
        return it; a new window starts (new ``stats``; the gauges keep their counts)."""
        for gauge in (self.engine, self.live, self.tools):
            gauge._advance()
        engine0, tools0, area0 = self._marks
        stats = self.stats
        stats.generation_time_s = self.engine.busy_s - engine0
        stats.engine_idle_s = max(0.0, span - stats.generation_time_s)
        stats.env_time_s += self.tools.busy_s - tools0
        stats.concurrent_episodes_max = self.live.max
        stats.concurrent_episodes_mean = (self.live.area - area0) / span if span > 0 else 0.0
        stats.tool_calls_concurrent_max = self.pool.max_running
        # a mode's own counter (RolloutStats.extra), once reported, is reported by every later
        # window, 0 included: a "sum" metric an iteration does not log reads NaN in RLlib
        self.stats, self._marks = RolloutStats(extra={k: 0 for k in stats.extra}), self._gauge_marks()
        self.live.max, self.pool.max_running = self.live.count, self.pool.running
        return stats


class AsyncMultiTurnRollout(MultiTurnRollout):
    """``MultiTurnRollout`` with one coroutine per episode (see the module doc).

    Args (besides ``MultiTurnRollout``'s):
        tool_concurrency: env steps running at once (worker threads); None = one per episode of
            the call (no episode ever waits for a thread).
        tool_timeout_s: seconds an env step may run before it becomes a timeout observation;
            None = no limit.
    """

    def __init__(
        self,
        engine: GenerationEngine,
        tokenizer: Any,
        env_factory: Callable[[], ToolEnv],
        sampling: SamplingConfig,
        config: RolloutConfig | None = None,
        *,
        tool_concurrency: int | None = None,
        tool_timeout_s: float | None = DEFAULT_TOOL_TIMEOUT_S,
    ) -> None:
        if tool_concurrency is not None and (isinstance(tool_concurrency, bool) or not isinstance(
                tool_concurrency, int) or tool_concurrency < 1):
            raise ValueError(f"tool_concurrency must be an int >= 1 or None (one per episode), "
                             f"got {tool_concurrency!r}")
        if tool_timeout_s is not None and (isinstance(tool_timeout_s, bool) or not isinstance(
                tool_timeout_s, (int, float)) or not tool_timeout_s > 0):
            raise ValueError(f"tool_timeout_s must be a number > 0 or None (no limit), got {tool_timeout_s!r}")
        # the resets are watched with the same limit as the env steps (one knob)
        super().__init__(engine, tokenizer, env_factory, sampling, config, step_timeout_s=tool_timeout_s)
        self.tool_concurrency = tool_concurrency
        self.tool_timeout_s = None if tool_timeout_s is None else float(tool_timeout_s)
        # envs whose abandoned call still ran when their episode ended: never read, never reused
        self._untrusted: set[int] = set()
        # the env steps' pool, kept across calls: starting a thread per episode on every call
        # cost ~5 ms for 32 episodes, a few % of a short call (benchmarks/agent_loop_throughput.py)
        self._pool: ToolPool | None = None
        self._pool_lock = threading.Lock()
        self._pool_demand = 0  # episodes of the calls running now (tool_concurrency None)

    def _acquire_pool(self, episodes: int) -> ToolPool:
        """The rollout's tool pool for a call of ``episodes`` episodes: ``tool_concurrency``
        workers, or (None) one per episode of every call running now; shut down with the rollout."""
        with self._pool_lock:
            self._pool_demand += episodes
            size = self.tool_concurrency or max(1, self._pool_demand)
            if self._pool is None:
                self._pool = ToolPool(size)
                weakref.finalize(self, self._pool.shutdown)
            else:  # its max_running was restarted when the last call's window closed (_Run)
                self._pool.grow(size)
            return self._pool

    def _release_pool(self, episodes: int) -> None:
        with self._pool_lock:
            self._pool_demand -= episodes

    def run(
        self, tasks: Sequence[dict[str, Any]], group_size: int, policy_version: int = 0
    ) -> tuple[list[Trajectory], RolloutStats]:
        """Sample ``group_size`` episodes for every task, each at its own pace; returns the
        trajectories in task order, as ``MultiTurnRollout.run``."""
        stats = RolloutStats()
        episodes = self._running = self._start_episodes(tasks, group_size, stats)
        run_on_agent_loop(self._run_all(episodes, stats))
        trajs = [self._finish(ep, policy_version) for ep in episodes]
        return trajs, stats

    async def _run_all(self, episodes: list[_Episode], stats: RolloutStats) -> None:
        pool = self._acquire_pool(len(episodes))
        run = _Run(stats, pool)
        t0 = time.perf_counter()
        seed = self.sampling.seed
        try:
            # an engine failure ends the whole call, as in turn_sync
            await self._episodes_or_none(episodes, run, seed)
        finally:
            run.close_window(time.perf_counter() - t0)
            self._release_pool(len(episodes))

    async def arun_group(self, task: dict[str, Any], group_size: int, seed: int | None, run: "_Run",
                         policy_version: int = 0) -> list[Trajectory]:
        """The ``group_size`` episodes of one task, on ``run`` (a stream's long-lived state,
        env_runners/rollout_stream.py) with the requests seeded from ``seed``; the group's
        trajectories in episode order. Resets run on the tool pool, off the event loop. A failure
        of the engine fails the group (the other episodes are cancelled); ``policy_version``:
        the version of segments the engine did not stamp."""
        loop = asyncio.get_running_loop()
        episodes = await loop.run_in_executor(None, self._start_episodes, [task], group_size, run.stats)
        if not episodes:  # its env.reset failed (counted in reset_failures): the group fails alone
            raise RuntimeError(f"env.reset failed: {self.last_reset_error}")
        await self._episodes_or_none(episodes, run, seed)
        return [self._finish(ep, policy_version, keep_stamps=True) for ep in episodes]

    async def _episodes_or_none(self, episodes: list[_Episode], run: "_Run", seed: int | None) -> None:
        """Run the episodes concurrently; when one raises (the engine failed), cancel the
        others and re-raise: all of them finish, or none is used."""
        tasks = []
        for i, ep in enumerate(episodes):
            # every episode is a member of the engine's batching before any of them submits (a
            # batch closed at the first request, while it was the only member, would cut the
            # first turn in pieces); it leaves once its task is done, however that ends
            member = self._batching_member()
            member.__enter__()
            task = asyncio.ensure_future(self._episode(ep, i, run, seed))
            task.add_done_callback(lambda _task, member=member: member.__exit__(None, None, None))
            tasks.append(task)
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _episode(self, ep: _Episode, index: int, run: _Run, seed_base: int | None) -> None:
        """One episode: generate a turn, step the env, until it ends; the requests are seeded
        from ``seed_base`` (:func:`request_seed`)."""
        pending: ToolCall | None = None  # an abandoned env step that may still use ep.env
        pending_turn = -1
        with run.live:
            while not ep.done:
                seed = request_seed(seed_base, index, ep.turns)
                with run.engine:
                    out = await self.engine.agenerate(ep.context, self.sampling, self._generation_cap(ep), seed=seed)
                run.stats.engine_calls += 1
                text = self._take_turn(ep, out, run.stats)
                if text is None:
                    break
                res, pending, pending_turn = await self._step(ep, text, pending, pending_turn, run)
                if res is None:
                    break
                if pending is not None and self.config.window:
                    # the window layout's next prompt is the env's (step_prompt), and the
                    # abandoned call still owns the env: the episode ends here
                    self._fail(ep, "env_step", ToolCallStillRunning(
                        f"an env step ran past tool_timeout_s={self.tool_timeout_s:g} s; with step_context='window' "
                        "the next step's prompt comes from the environment, which the abandoned call still owns, "
                        "so the episode ends"), run.stats)
                    break
                self._take_step(ep, res, run.stats)
            if pending is not None:
                if await pending.finish(self.tool_timeout_s):
                    self._take_late(ep, pending, pending_turn, run.stats)
                else:
                    self._untrusted.add(id(ep.env))

    def _batching_member(self) -> Any:
        """The engine's batching membership for one episode (engines/batching.py); a null
        context for an engine that has none (a duck-typed engine)."""
        member = getattr(self.engine, "batching_member", None)
        return member() if member is not None else contextlib.nullcontext()

    async def _step(self, ep: _Episode, text: str, pending: ToolCall | None, pending_turn: int,
                    run: _Run) -> tuple[StepResult | None, ToolCall | None, int]:
        """Step ``ep.env`` with ``text`` on the pool: (what to record, or None when the episode
        ended here; the call still pending on the env; its turn)."""
        timeout = self.tool_timeout_s
        t0 = time.perf_counter()
        if pending is not None:  # the env is still the abandoned call's: wait for it first
            with run.tools:
                finished = await pending.finish(timeout)
            if not finished:
                run.stats.tool_timeouts += 1
                run.stats.tool_latencies_s.append(time.perf_counter() - t0)
                return StepResult(timeout_observation(timeout), 0.0, False), pending, pending_turn
            if not self._take_late(ep, pending, pending_turn, run.stats):
                return None, None, -1
        budget = None if timeout is None else timeout - (time.perf_counter() - t0)
        call = run.pool.submit(ep.env.step, text)
        try:
            with run.tools:
                finished = await call.finish(budget)
        except asyncio.CancelledError:
            run.pool.cancel(call)
            raise
        if not finished and run.pool.abandon(call):
            run.stats.tool_timeouts += 1
            run.stats.tool_calls_abandoned += 1
            run.stats.tool_latencies_s.append(time.perf_counter() - t0)
            return StepResult(timeout_observation(timeout), 0.0, False), call, ep.turns - 1
        if not call.done:  # it returned just as it was abandoned: wait for its result to arrive
            await call.finish(None)
        run.stats.tool_latencies_s.append(call.elapsed_s)
        try:
            return call.result(), None, -1
        except Exception as exc:  # environments must not crash a run; record and end it
            ep.env_error = repr(exc)
            self._fail(ep, "env_step", exc, run.stats)
            return None, None, -1

    def _take_late(self, ep: _Episode, call: ToolCall, turn: int, stats: RolloutStats) -> bool:
        """Record what an abandoned call returned after all (see the module doc); False when
        that ended the episode."""
        try:
            res = call.result()
        except Exception as exc:
            ep.env_error = repr(exc)
            self._fail(ep, "env_step", exc, stats)
            return False
        try:
            reward, done = float(res.reward), bool(res.done or res.observation is None)
        except Exception as exc:
            self._fail(ep, "reward", exc, stats)
            return False
        if 0 <= turn < len(ep.env_rewards):
            ep.env_rewards[turn] = reward
        if done:
            ep.done = True
            return False
        return True

    def _episode_stats(self, ep: _Episode) -> Any:
        if id(ep.env) in self._untrusted:
            raise ToolCallStillRunning(
                f"a tool call this episode abandoned still ran {self.tool_timeout_s:g} s after the episode ended; "
                "its environment cannot be read safely")
        return super()._episode_stats(ep)

    def _release_env(self, env: ToolEnv) -> None:
        if id(env) in self._untrusted:  # its abandoned call may still change it: never reused
            self._untrusted.discard(id(env))
            return
        super()._release_env(env)

