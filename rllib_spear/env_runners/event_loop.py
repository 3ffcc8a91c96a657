"""The process's agent event loop: one long-lived asyncio loop on a daemon thread.

The async rollout (env_runners/async_rollout.py) runs its episode coroutines here, and every
``GenerationEngine.agenerate`` is awaited here. One loop for the whole process, never a fresh
``asyncio.run`` per call, because an async engine binds state to the loop it first ran on (vLLM's
``AsyncLLM`` starts its output handler as a task of that loop): the training and the evaluation
rollouts, every call of them, must reach the engine from the same loop.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine, TypeVar

__all__ = ["agent_loop", "run_on_agent_loop"]

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def agent_loop() -> asyncio.AbstractEventLoop:
    """The process's agent loop, started on first use (a daemon thread: it never keeps the
    process alive)."""
    global _loop, _thread
    with _lock:
        if _loop is None or _thread is None or not _thread.is_alive():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="rllib-spear-agent-loop", daemon=True)
            thread.start()
            _loop, _thread = loop, thread
        return _loop


def run_on_agent_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the agent loop and block the calling thread until it returns (or raises).
    Called from the agent loop's own thread it would wait for itself: that raises instead."""
    loop = agent_loop()
    if threading.current_thread() is _thread:
        coro.close()
        raise RuntimeError("run_on_agent_loop called from the agent loop itself; await the coroutine instead")
    fut = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return fut.result()
    except BaseException:  # an interrupted caller (Ctrl-C) must not leave the run going on
        fut.cancel()
        raise
