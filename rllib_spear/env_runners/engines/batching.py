"""Continuous batching over a synchronous, batched ``generate``: what ``GenerationEngine.agenerate``
does for an engine without an async engine of its own (the HF engine; docs/design.md "The agent
loop").

Each episode coroutine awaits one request at a time. Requests queue; one worker thread takes what
is queued and runs one ``generate`` call for it, and requests that arrive while that batch decodes
wait for the next batch. A batch closes when ``max_batch_size`` requests are queued, or when no
request arrived for ``gather_window_s`` (a burst of requests, such as the episodes of a batch that
all finished their tool calls, keeps it open), and at the latest ``max_gather_s`` after its first
request arrived: a request that waited in the queue while the previous batch decoded goes at once.
It also closes as soon as every *member* waits in the queue: the async loop's episodes hold
:meth:`BatchingScheduler.member` while they run, and once all of them have queued a request no
other request can come before one of them is served, so waiting out the window would only idle
the engine (it cost ~3 ms a batch, ~10% of a short call with fast tools).

Why a next-batch scheduler and not requests joining the running batch at its next decode step (as
vLLM does): the HF engine's batch is one left-padded key/value buffer per layer, so a row
that joins mid-decode would need its prompt prefilled at the batch's current length and the cache
re-padded and concatenated at every join, a second decode path to keep exact (log-probs, stop
strings, caps) for little gain on the CPU runs and tests this engine serves; the decode loop stays
the one ``generate`` already has, rows still leave the batch as soon as they finish, and the cost
is that a request arriving during a decode waits for it to end.

Seeds: when every request of a batch has a seed, the batch carries them as
``SamplingConfig.row_seeds`` and an engine that honours it (the HF engine's per-row streams,
``hf_engine.RowStreams``) samples each row from its own seed: a request's tokens then depend on its
prompt and seed, not on which requests shared its batch, so a fixed seed reproduces an async run
whatever the timing (up to the last-bit rounding that another batch shape can give the logits).
An engine that ignores ``row_seeds`` draws from one generator seeded with :func:`batch_seed` (the
same for any arrival order; the rows are put in seed order): the same requests batched the same way
give the same tokens.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from .base import GenerationOutput, SamplingConfig

__all__ = ["BatchingScheduler", "batch_seed", "sampling_key"]

#: ``generate(prompts, sampling, max_new_tokens)`` of a ``GenerationEngine``.
GenerateFn = Callable[[list[list[int]], SamplingConfig, list[int]], list[GenerationOutput]]


def batch_seed(seeds: Sequence[int | None]) -> int | None:
    """One 63-bit seed for a batch from its requests' seeds, the same for any order of them;
    None when no request has a seed (the engine then draws one)."""
    known = sorted(int(s) % 2**64 for s in seeds if s is not None)
    if not known:
        return None
    return int(np.random.SeedSequence(known).generate_state(1, np.uint64)[0] >> np.uint64(1))


def sampling_key(sampling: SamplingConfig) -> tuple:
    """What requests must share to go in one ``generate`` call (their seed and token cap may
    differ: the batch gets one derived seed and per-row caps)."""
    return (float(sampling.temperature), float(sampling.top_p), int(sampling.top_k),
            tuple(sampling.stop), tuple(int(t) for t in sampling.stop_token_ids))


@dataclass
class _Request:
    prompt: list[int]
    sampling: SamplingConfig
    cap: int
    seed: int | None
    key: tuple
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    arrived: float


def _settle(fut: asyncio.Future, value: GenerationOutput | None, exc: BaseException | None) -> None:
    if fut.done():  # the awaiting episode was cancelled
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)


class BatchingScheduler:
    """Batches concurrent single-prompt requests into calls of ``generate`` on a worker thread.

    Args:
        generate: the engine's batched ``generate(prompts, sampling, max_new_tokens)``.
        gather_window_s: a batch closes once no request arrived for this long.
        max_gather_s: ... or this long after its first request arrived, whichever comes first.
        max_batch_size: ... or as soon as this many requests are queued (None: no limit).
    """

    def __init__(self, generate: GenerateFn, *, gather_window_s: float = 0.003, max_gather_s: float = 0.05,
                 max_batch_size: int | None = None, name: str = "engine") -> None:
        if not gather_window_s >= 0 or not max_gather_s >= gather_window_s:
            raise ValueError(f"BatchingScheduler: need 0 <= gather_window_s <= max_gather_s, got "
                             f"{gather_window_s!r} and {max_gather_s!r}")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"BatchingScheduler: max_batch_size must be >= 1 or None, got {max_batch_size!r}")
        self._generate = generate
        self.gather_window_s, self.max_gather_s = float(gather_window_s), float(max_gather_s)
        self.max_batch_size = max_batch_size
        self.name = name
        self._cond = threading.Condition()
        self._queue: list[_Request] = []
        self._last_arrival = 0.0
        self._members = 0  # episodes of the async loop running now (member())
        self._closed = False
        self._thread: threading.Thread | None = None
        # counters (benchmarks and tests read them): generate calls, those closed because every
        # member waited, requests served, the largest batch, and the time spent inside generate
        self.batches = 0
        self.batches_of_all_members = 0
        self.requests = 0
        self.max_batch = 0
        self.busy_s = 0.0

    @property
    def running(self) -> bool:
        """Whether the worker thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    @contextlib.contextmanager
    def member(self) -> Iterator[None]:
        """Held by one episode while it runs (see the module doc): a batch closes once every
        member's request is queued. Thread-safe; members that never submit only keep batches to
        their usual window."""
        with self._cond:
            self._members += 1
        try:
            yield
        finally:
            with self._cond:
                self._members -= 1
                # an episode that ended is news of the burst as much as a request: it keeps the
                # window open, and the batch being gathered may now hold every member
                self._last_arrival = time.monotonic()
                self._cond.notify()

    async def submit(self, prompt: Sequence[int], sampling: SamplingConfig, max_new_tokens: int,
                     seed: int | None = None) -> GenerationOutput:
        """Queue one request and wait for its output. ``seed`` None falls back to
        ``sampling.seed``; ``max_new_tokens`` caps this request (with ``sampling.max_new_tokens``)."""
        if len(prompt) == 0:
            raise ValueError("agenerate: the prompt is empty")
        sampling.validate()
        loop = asyncio.get_running_loop()
        req = _Request([int(t) for t in prompt], sampling, int(max_new_tokens),
                       seed if seed is not None else sampling.seed, sampling_key(sampling), loop,
                       loop.create_future(), time.monotonic())
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{self.name}: the batching scheduler is closed (engine shut down)")
            self._queue.append(req)
            self._last_arrival = req.arrived
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=f"rllib-spear-{self.name}-batcher",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()
        return await req.future

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop the worker after the batch it is decoding; queued requests fail."""
        with self._cond:
            self._closed = True
            left, self._queue = self._queue, []
            self._cond.notify_all()
        for req in left:
            self._resolve(req, None, RuntimeError(f"{self.name}: the engine shut down before this request ran"))
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # ------------------------------------------------------------------ worker thread
    def _work(self) -> None:
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            self._run(batch)

    def _take_batch(self) -> list[_Request] | None:
        """Wait for requests, gather a batch (see the module doc), take it off the queue."""
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            first = self._queue[0]
            limit = self.max_batch_size
            while not self._closed:
                if limit is not None and sum(r.key == first.key for r in self._queue) >= limit:
                    break
                if self._members and len(self._queue) >= self._members:  # nobody else can come
                    self.batches_of_all_members += 1
                    break
                end = min(self._last_arrival + self.gather_window_s, first.arrived + self.max_gather_s)
                now = time.monotonic()
                if now >= end:
                    break
                self._cond.wait(end - now)
            if self._closed:
                return None
            batch = [r for r in self._queue if r.key == first.key][:limit]
            taken = {id(r) for r in batch}
            self._queue = [r for r in self._queue if id(r) not in taken]
            return batch

    def _run(self, batch: list[_Request]) -> None:
        # seed order, arrival order among equal seeds: the rows do not depend on who came first
        batch.sort(key=lambda r: (r.seed is None, r.seed if r.seed is not None else 0))
        caps = [min(r.cap, r.sampling.max_new_tokens) for r in batch]
        seeds = [r.seed for r in batch]
        sampling = dataclasses.replace(batch[0].sampling, seed=batch_seed(seeds),
                                       row_seeds=None if None in seeds else tuple(int(x) for x in seeds),
                                       max_new_tokens=max(1, max(caps)))
        t0 = time.perf_counter()
        try:
            outs = self._generate([r.prompt for r in batch], sampling, caps)
            if len(outs) != len(batch):
                raise RuntimeError(f"{self.name}: generate returned {len(outs)} outputs for {len(batch)} prompts")
        except Exception as exc:  # every request of the batch gets the error, the worker goes on
            for r in batch:
                self._resolve(r, None, exc)
            return
        finally:
            self.busy_s += time.perf_counter() - t0
            self.batches += 1
            self.requests += len(batch)
            self.max_batch = max(self.max_batch, len(batch))
        for r, out in zip(batch, outs):
            self._resolve(r, out, None)

    @staticmethod
    def _resolve(req: _Request, value: GenerationOutput | None, exc: BaseException | None) -> None:
        try:
            req.loop.call_soon_threadsafe(_settle, req.future, value, exc)
        except RuntimeError:  # the awaiting loop is gone: nobody waits for this output
            pass
