"""A bounded pool of worker threads for the env steps of the async agent loop.

Env steps (tool calls: a retriever, a sandbox cell, a user's HTTP function) are blocking Python
calls, so they never run on the event loop: each runs on one of ``size`` worker threads, and at
most ``size`` run at once (the rest wait in the queue; waiting is not counted against a call's
timeout, which bounds the tool, not the pool).

A call that times out is *abandoned* (:meth:`ToolPool.abandon`): Python cannot stop a thread, so
its worker is left to finish the call, then exits, and a fresh worker takes its place at once, so
a hung tool never shrinks the pool. The workers are daemon threads, unlike
``concurrent.futures.ThreadPoolExecutor``'s, which the interpreter joins at exit: a call that never
returns cannot keep the process alive. ``ToolPool.stuck`` counts abandoned calls still running.

Two ways to wait: an episode coroutine submits a :class:`ToolCall` and awaits it
(:meth:`ToolPool.submit`); a plain thread calls :meth:`ToolPool.call`, which blocks it for at most
the timeout (the turn-synchronous loop's env steps, a watched engine call: the watchdogs of
docs/design.md "Fault tolerance").
"""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any, Callable

__all__ = ["ToolPool", "ToolCall", "BlockingCall"]


def _post(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


class ToolCall:
    """One call submitted to a :class:`ToolPool`; awaited with :meth:`finish`."""

    def __init__(self, fn: Callable[..., Any], args: tuple, loop: asyncio.AbstractEventLoop | None) -> None:
        self.fn, self.args, self.loop = fn, args, loop
        self._started, self._done = self._signals()
        # written by the worker, read by the loop once ``_done`` is set
        self.value: Any = None
        self.error: BaseException | None = None
        self.elapsed_s = 0.0  # how long the call ran on its worker
        # under the pool's lock: the worker returned / the loop gave up waiting / never to start
        self.finished = False
        self.abandoned = False
        self.cancelled = False

    def _signals(self) -> tuple[Any, Any]:
        """(started, done): futures of the loop that awaits the call."""
        return self.loop.create_future(), self.loop.create_future()

    @property
    def done(self) -> bool:
        """The call returned or raised (as far as the loop knows)."""
        return self._done.done()

    async def finish(self, timeout: float | None) -> bool:
        """Wait until the call has started on a worker, then up to ``timeout`` seconds (None:
        no limit) for it to return; True when it returned (or raised) in time."""
        await asyncio.shield(self._started)
        if timeout is None:
            await asyncio.shield(self._done)
            return True
        try:
            await asyncio.wait_for(asyncio.shield(self._done), max(0.0, timeout))
        except asyncio.TimeoutError:
            return self._done.done()
        return True

    def result(self) -> Any:
        """What the call returned; re-raises what it raised. Only once :attr:`done`."""
        if self.error is not None:
            raise self.error
        return self.value

    def _notify(self, fut: asyncio.Future, value: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(_post, fut, value)
        except RuntimeError:  # the loop is gone: nobody waits for this call any more
            pass


class BlockingCall(ToolCall):
    """A call that a plain thread waits for (:meth:`ToolPool.call`): its signals are threading
    events, not futures of an event loop."""

    def __init__(self, fn: Callable[..., Any], args: tuple) -> None:
        super().__init__(fn, args, None)

    def _signals(self) -> tuple[threading.Event, threading.Event]:
        return threading.Event(), threading.Event()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def _notify(self, fut: threading.Event, value: Any) -> None:
        fut.set()


class ToolPool:
    """At most ``size`` calls run at once, each on a daemon worker thread (see the module doc).

    Counters: ``running`` / ``max_running`` (calls executing now / at most at once, abandoned
    ones included), ``abandoned`` (calls given up on), ``stuck`` (of those, still running)."""

    def __init__(self, size: int, name: str = "tool") -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"ToolPool: size must be an int >= 1, got {size!r}")
        self.size, self.name = size, name
        self._jobs: queue.SimpleQueue[ToolCall | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self.running = self.max_running = 0
        self.abandoned = self.stuck = 0
        self._workers = 0
        for _ in range(size):
            self._spawn()

    def _spawn(self) -> None:
        with self._lock:
            self._workers += 1
            n = self._workers
        threading.Thread(target=self._work, name=f"rllib-spear-{self.name}-{n}", daemon=True).start()

    def grow(self, size: int) -> None:
        """Let up to ``size`` calls run at once (a pool never shrinks: its idle workers cost
        nothing but their stacks)."""
        with self._lock:
            extra, self.size = max(0, int(size) - self.size), max(self.size, int(size))
        for _ in range(extra):
            self._spawn()

    def submit(self, fn: Callable[..., Any], *args: Any) -> ToolCall:
        """Queue ``fn(*args)``; call from the event loop that will await it."""
        if self._closed:
            raise RuntimeError(f"ToolPool {self.name!r} is shut down")
        call = ToolCall(fn, args, asyncio.get_running_loop())
        self._jobs.put(call)
        return call

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float | None) -> BlockingCall:
        """Run ``fn(*args)`` on a worker and block this thread until it returns, or for at most
        ``timeout`` seconds once it started (None: no limit). A call still running then is
        abandoned (``call.abandoned``; :meth:`abandon`); otherwise ``call.result()`` is what it
        returned or raised. Thread-safe; no event loop involved."""
        if self._closed:
            raise RuntimeError(f"ToolPool {self.name!r} is shut down")
        call = BlockingCall(fn, args)
        self._jobs.put(call)
        call._started.wait()  # a worker is always free: an abandoned one is replaced at once
        if not call._done.wait(timeout) and self.abandon(call):
            return call
        call._done.wait()  # it returned just as it was abandoned: its result is about to be there
        return call

    def abandon(self, call: ToolCall) -> bool:
        """Give up on a call that timed out: its worker is replaced now and exits once the call
        returns. False when the call finished meanwhile (its result is there to read)."""
        with self._lock:
            if call.finished:
                return False
            call.abandoned = True
            self.abandoned += 1
            self.stuck += 1
        if not self._closed:
            self._spawn()
        return True

    def cancel(self, call: ToolCall) -> None:
        """Drop a queued call before it starts (a started one runs to its end)."""
        with self._lock:
            call.cancelled = True

    def shutdown(self) -> None:
        """The healthy workers exit once the queue is drained; abandoned calls keep running."""
        self._closed = True
        with self._lock:
            healthy = self._workers - self.stuck
        for _ in range(max(0, healthy)):
            self._jobs.put(None)

    def _work(self) -> None:
        while True:
            call = self._jobs.get()
            if call is None:
                return
            with self._lock:
                if call.cancelled:
                    continue
                self.running += 1
                self.max_running = max(self.max_running, self.running)
            call._notify(call._started, None)
            t0 = time.perf_counter()
            try:
                call.value = call.fn(*call.args)
            except BaseException as exc:  # handed to the awaiting episode, which decides
                call.error = exc
            call.elapsed_s = time.perf_counter() - t0
            with self._lock:
                call.finished = True
                self.running -= 1
                retire = call.abandoned
                if retire:
                    self.stuck -= 1
                    self._workers -= 1
            call._notify(call._done, None)
            if retire:  # a fresh worker took this one's place when the call was abandoned
                return
