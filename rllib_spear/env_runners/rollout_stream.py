"""A runner's sampling stream for fully asynchronous training (``rollout_pipeline="async"``).

The driver submits groups (one task, G episodes, a seed) and takes the finished ones; in between
the runner samples without pause on the process's agent loop (env_runners/event_loop.py), one
coroutine per episode (``AsyncMultiTurnRollout.arun_group``), while the actor's own thread serves
the driver's calls: weight syncs land in the engine between two batches (engines/update_gate.py),
so an episode in flight continues on the new weights at its next turn (a partial rollout) and each
of its segments records the version that sampled it. docs/design.md "Fully asynchronous training"
has the driver's side (pipelines/fully_async.py).

No Ray here: ``LLMEnvRunner`` exposes it as ``stream_submit`` / ``stream_take`` / ``stream_stop``.
"""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

from ..core.trajectory import Trajectory
from .async_rollout import AsyncMultiTurnRollout, _Run
from .event_loop import agent_loop
from .rollout import RolloutStats, _describe
from .tool_pool import ToolPool

__all__ = ["GroupRequest", "GroupResult", "RolloutStream"]


@dataclass
class GroupRequest:
    """One group to sample: ``key`` is the driver's id of the submission."""

    key: int
    task: dict[str, Any]
    group_size: int
    seed: int | None = None


@dataclass
class GroupResult:
    """A finished group: its trajectories, or the error that failed it (then none)."""

    key: int
    trajectories: list[Trajectory] = field(default_factory=list)
    error: str | None = None


class RolloutStream:
    """Samples submitted groups concurrently until they are taken or the stream stops.

    Args:
        rollout: the runner's async rollout (its engine, env pool and sampling parameters).
        tool_concurrency: env steps running at once across every group in flight.
        version: a callable returning the runner's weights version (segments the engine does
            not stamp record it).
    """

    def __init__(self, rollout: AsyncMultiTurnRollout, tool_concurrency: int,
                 version: Callable[[], int] = lambda: 0) -> None:
        self.rollout = rollout
        self._version = version
        self._loop = agent_loop()
        self._cond = threading.Condition()
        self._done: list[GroupResult] = []
        self._futures: dict[int, Future] = {}
        self._pool = ToolPool(int(tool_concurrency), name="stream-tool")
        self._run = _Run(RolloutStats(), self._pool)
        self._window_t0 = time.perf_counter()
        self._stopped = False

    # ------------------------------------------------------------------ driver calls
    def submit(self, requests: list[GroupRequest]) -> int:
        """Start sampling ``requests`` now; returns the groups in flight."""
        if self._stopped:
            raise RuntimeError("RolloutStream: submit after stop")
        for req in requests:
            with self._cond:
                if req.key in self._futures:
                    raise ValueError(f"RolloutStream: group {req.key} is already in flight")
                self._futures[req.key] = asyncio.run_coroutine_threadsafe(self._group(req), self._loop)
        return self.in_flight

    def take(self, min_groups: int = 1, timeout_s: float = 0.0) -> tuple[list[GroupResult], RolloutStats]:
        """The groups finished since the last take, waiting up to ``timeout_s`` for at least
        ``min_groups`` (less when fewer are in flight), and the loop's counters of that window."""
        with self._cond:
            self._cond.wait_for(lambda: len(self._done) >= min(min_groups, len(self._done) + len(self._futures)),
                                timeout=max(0.0, float(timeout_s)))
            done, self._done = self._done, []
        return done, self._close_window()

    @property
    def in_flight(self) -> int:
        with self._cond:
            return len(self._futures)

    def in_flight_keys(self) -> list[int]:
        with self._cond:
            return sorted(self._futures)

    def stop(self, timeout_s: float = 30.0) -> int:
        """Cancel every group in flight and forget the finished ones not taken; returns how
        many groups were dropped. Their episodes' tool calls still running are abandoned."""
        self._stopped = True
        with self._cond:
            futures, self._futures = dict(self._futures), {}
            dropped = len(futures) + len(self._done)
            self._done = []
        for fut in futures.values():
            fut.cancel()
        deadline = time.monotonic() + timeout_s
        for fut in futures.values():
            try:
                fut.result(timeout=max(0.0, deadline - time.monotonic()))
            except BaseException:  # cancelled (the usual case) or failed: dropped either way
                pass
        self._pool.shutdown()
        return dropped

    # ------------------------------------------------------------------ on the agent loop
    async def _group(self, req: GroupRequest) -> None:
        try:
            trajs = await self.rollout.arun_group(req.task, int(req.group_size), req.seed, self._run,
                                                  policy_version=self._version())
            result = GroupResult(req.key, trajs)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # e.g. the engine failed: the group is lost, the stream goes on
            result = GroupResult(req.key, error=_describe(exc))
        with self._cond:
            if self._futures.pop(req.key, None) is not None:  # not stopped meanwhile
                self._done.append(result)
            self._cond.notify_all()

    def _close_window(self) -> RolloutStats:
        """The counters since the last take (closed on the agent loop, where the gauges move)."""
        now = time.perf_counter()
        span, self._window_t0 = now - self._window_t0, now

        async def close() -> RolloutStats:
            return self._run.close_window(span)

        return asyncio.run_coroutine_threadsafe(close(), self._loop).result()
