"""The generation-engine interface shared by the HF and vLLM engines.

Token-in/token-out: prompts are token ids, outputs are the sampled token ids exactly as the
engine produced them (stop strings and the end-of-turn token kept), with the log-prob of each
sampled token under the *sampling* distribution at temperature T (logits / T, before top-p/top-k
truncation), which is what the trainer recomputes.

Temperature 0 is greedy decoding (evaluation): the argmax token at every step, top-p/top-k
ignored, the same output for any seed; its log-probs are those of softmax(logits) (T = 1).

Two entry points: ``generate`` (a batch, the turn-synchronous loop) and ``agenerate`` (one
request awaited by one episode coroutine of the async agent loop, docs/design.md "The agent
loop"), which by default batches concurrent requests over ``generate`` (engines/batching.py).

``TimedEngine`` (``with_generation_timeout``) is the engine-call watchdog of docs/design.md "Fault
tolerance": a call still running after ``generation_timeout_s`` raises ``GenerationTimeout``.
"""
from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterable, Literal, Mapping, Sequence

import torch

if TYPE_CHECKING:
    from .batching import BatchingScheduler
    from .update_gate import WeightUpdateGate

__all__ = ["SamplingConfig", "GenerationOutput", "GenerationEngine", "GenerationTimeout", "TimedEngine",
           "with_generation_timeout", "DEFAULT_GENERATION_TIMEOUT_S"]

#: Generous: no healthy engine call comes near an hour (a batched vLLM turn of 512 x 16k tokens
#: takes minutes), yet an engine that hangs (a stuck collective, a dead worker) cannot stall a run.
DEFAULT_GENERATION_TIMEOUT_S = 3600.0


@dataclass
class SamplingConfig:
    """Sampling parameters, mirrored on vLLM's SamplingParams (``temperature=0``: greedy)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 = disabled (vLLM convention)
    max_new_tokens: int = 256
    stop: list[str] = field(default_factory=list)  # stop strings, kept in the output
    stop_token_ids: list[int] = field(default_factory=list)  # eos is always a stop
    seed: int | None = None
    # One seed per prompt of a ``generate`` call (the batching scheduler sets it from its requests'
    # seeds): an engine that honours it samples each row from its own stream, so a request's tokens
    # do not depend on which other requests share its batch. None: one stream from ``seed``.
    row_seeds: tuple[int, ...] | None = None

    def validate(self) -> None:
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise ValueError(f"SamplingConfig.temperature must be > 0, or 0 for greedy decoding, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"SamplingConfig.top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingConfig.max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        """Temperature 0: argmax decoding."""
        return self.temperature == 0


@dataclass
class GenerationOutput:
    """One completion: sampled ids, their log-probs, and why generation stopped.
    ``policy_version``: the weights version it was sampled with, when the engine knows it (the
    default ``agenerate`` and vLLM's async engine stamp it; engines/update_gate.py)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    policy_version: int | None = None


_SCHEDULER_LOCK = threading.Lock()


class GenerationEngine(ABC):
    """A batched sampler over token-id prompts with in-place, versioned weight updates."""

    #: Version of the weights currently served (0 = initial weights).
    version: int = 0
    #: The default ``agenerate``'s batching (engines/batching.py; and the in-process vLLM core's
    #: gathering, vllm_async.py): a batch closes once no request
    #: arrived for ``gather_window_s``, at the latest ``max_gather_s`` after its first request.
    gather_window_s: float = 0.003
    max_gather_s: float = 0.05

    @abstractmethod
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[GenerationOutput]:
        """Sample one completion per prompt. ``max_new_tokens`` optionally caps each prompt
        separately (context budget); otherwise ``sampling.max_new_tokens`` applies to all."""

    async def agenerate(self, prompt: Sequence[int], sampling: SamplingConfig, max_new_tokens: int,
                        seed: int | None = None) -> GenerationOutput:
        """Sample one completion of ``prompt``, capped at ``min(max_new_tokens,
        sampling.max_new_tokens)``, with the request's own ``seed`` (None: ``sampling.seed``).

        One request, awaited by one episode coroutine on the process's agent loop
        (env_runners/event_loop.py); an engine may bind loop state to that loop. This default is
        a continuous-batching scheduler over :meth:`generate` (engines/batching.py: concurrent
        requests share a ``generate`` call on a worker thread, requests arriving during a decode
        go in the next one; the batch's seed is derived from its requests' seeds, so results are
        identically distributed to ``generate``'s, not identical). An engine with an async engine
        of its own (vLLM's ``AsyncLLM``) overrides it."""
        return await self.batching_scheduler().submit(prompt, sampling, max_new_tokens, seed)

    def batching_member(self) -> ContextManager[None]:
        """Held by each episode of the async loop while it runs, so that the default
        :meth:`agenerate`'s scheduler closes a batch as soon as every running episode waits in
        it (engines/batching.py). An engine with an async engine of its own overrides it
        (``VLLMEngine``: its in-process core gathers a burst by it)."""
        return self.batching_scheduler().member()

    def batching_scheduler(self) -> "BatchingScheduler":
        """The scheduler of the default :meth:`agenerate`, made on first use (its worker thread
        starts with the first request; :meth:`close_batching` stops it)."""
        sched = self.__dict__.get("_batching_scheduler")
        if sched is None:
            from .batching import BatchingScheduler

            with _SCHEDULER_LOCK:
                sched = self.__dict__.get("_batching_scheduler")
                if sched is None:
                    sched = BatchingScheduler(self._generate_gated, gather_window_s=self.gather_window_s,
                                              max_gather_s=self.max_gather_s,
                                              max_batch_size=getattr(self, "max_batch_size", None),
                                              name=type(self).__name__)
                    self.__dict__["_batching_scheduler"] = sched
        return sched

    @property
    def update_gate(self) -> "WeightUpdateGate":
        """Orders the default ``agenerate``'s batches and the weight updates of a runner that
        samples while it receives weights (engines/update_gate.py); made on first use."""
        gate = self.__dict__.get("_update_gate")
        if gate is None:
            from .update_gate import WeightUpdateGate

            with _SCHEDULER_LOCK:
                gate = self.__dict__.setdefault("_update_gate", WeightUpdateGate())
        return gate

    def _generate_gated(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                        max_new_tokens: Sequence[int] | None = None) -> list[GenerationOutput]:
        """``generate`` for the batching scheduler: never while a weight update is open, and
        every output stamped with the version it ran on."""
        with self.update_gate.generating():
            version = self.version
            outs = self.generate(prompts, sampling, max_new_tokens)
        for out in outs:
            out.policy_version = version
        return outs

    def close_batching(self) -> None:
        """Stop the default :meth:`agenerate`'s worker thread (after the batch it decodes); a
        later request starts a new scheduler."""
        sched = self.__dict__.pop("_batching_scheduler", None)
        if sched is not None:
            sched.close()

    @abstractmethod
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load new policy weights in place and set ``self.version = version``."""

    def load_weights_stream(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load ``(name, tensor)`` pairs (any subset of the names, HF naming) in place, consuming
        the iterable one tensor at a time, and leave ``self.version`` alone (the caller sets it
        once the whole sync arrived: docs/design.md "Weight streaming"). This default collects
        the pairs and calls ``update_weights``; the built-in engines stream."""
        self.update_weights(dict(named_tensors), version=self.version)

    def sleep(self, level: int = 1) -> bool:
        """Give the accelerator memory to a colocated learner until :meth:`wake_up`
        (docs/design.md "Cluster placement"): level 1 keeps the weights in host memory and drops
        the KV cache; level 2 may drop the weights too. Returns True when the weights are gone
        (the next weight sync must write all of them before the engine samples), else False.
        This default frees nothing: an engine without a sleep mode keeps its memory, and the
        colocated run goes on (slower on a shared GPU, never wrong)."""
        if isinstance(level, bool) or level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level!r}")
        return False

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Reallocate what :meth:`sleep` freed: ``tags`` among ("weights", "kv_cache"), None =
        both. A colocated run wakes the weights, syncs them, then wakes the KV cache. Waking an
        awake engine does nothing (this default: nothing is ever asleep)."""

    def shutdown(self) -> None:
        """Release engine resources (this default: the batching scheduler's thread; engines
        with resources of their own override it and call it)."""
        self.close_batching()


class GenerationTimeout(TimeoutError):
    """An engine call ran past ``generation_timeout_s``, or the engine hung in an earlier one."""


class TimedEngine:
    """``engine`` with a watchdog on its calls: ``generate`` / ``agenerate`` raise
    :class:`GenerationTimeout` once a call ran ``timeout_s`` seconds (``agenerate``: from the
    request's submission, queueing in the batching scheduler included). Every other attribute is
    the engine's own (read and written through), so the wrapper is invisible to weight syncs,
    the update gate and the batching scheduler.

    A hung call cannot be stopped (``generate`` runs on a worker thread that is abandoned; an
    ``agenerate`` is cancelled, but the decode it waits for may still run), and an engine that
    hung cannot be trusted: from then on every call raises at once, and ``on_timeout(exc)`` (the
    runner: docs/design.md "Fault tolerance") is called once, to count it and restart the runner.
    ``timeouts`` counts the calls that timed out."""

    _OWN = frozenset({"engine", "timeout_s", "on_timeout", "timeouts", "hung", "_pool"})

    def __init__(self, engine: GenerationEngine, timeout_s: float,
                 on_timeout: Callable[[GenerationTimeout], None] | None = None) -> None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"generation_timeout_s must be a number of seconds > 0, or None for no limit, "
                             f"got {timeout_s!r}")
        from ..tool_pool import ToolPool  # the env steps' bounded worker, here with one thread

        object.__setattr__(self, "engine", engine)
        object.__setattr__(self, "timeout_s", float(timeout_s))
        object.__setattr__(self, "on_timeout", on_timeout)
        object.__setattr__(self, "timeouts", 0)
        object.__setattr__(self, "hung", None)  # the first timeout's message, once the engine hung
        object.__setattr__(self, "_pool", ToolPool(1, name="engine-call"))

    def __getattr__(self, name: str) -> Any:  # only for what the wrapper does not define
        if name in self._OWN:  # not set yet (a copy being built): never recurse into self.engine
            raise AttributeError(name)
        return getattr(self.engine, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._OWN:
            object.__setattr__(self, name, value)
        else:  # e.g. ``version``: the engine's own state
            setattr(self.engine, name, value)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                 max_new_tokens: Sequence[int] | None = None) -> list[GenerationOutput]:
        self._refuse_if_hung()
        call = self._pool.call(self.engine.generate, prompts, sampling, max_new_tokens, timeout=self.timeout_s)
        if call.abandoned:
            self._timed_out(f"engine.generate of {len(prompts)} prompt(s)")
        return call.result()

    async def agenerate(self, prompt: Sequence[int], sampling: SamplingConfig, max_new_tokens: int,
                        seed: int | None = None) -> GenerationOutput:
        self._refuse_if_hung()
        try:
            return await asyncio.wait_for(self.engine.agenerate(prompt, sampling, max_new_tokens, seed=seed),
                                          self.timeout_s)
        except asyncio.TimeoutError:
            self._timed_out("engine.agenerate")
            raise  # unreachable: _timed_out raises

    def shutdown(self) -> None:
        self._pool.shutdown()
        self.engine.shutdown()

    def _refuse_if_hung(self) -> None:
        if self.hung is not None:
            raise GenerationTimeout(f"the engine hung in an earlier call ({self.hung}) and cannot be trusted; "
                                    "the env runner must be restarted")

    def _timed_out(self, what: str) -> None:
        msg = (f"{what} still running after generation_timeout_s={self.timeout_s:g} s: the engine hung (or the "
               "call is slower than the limit: raise .env_runners(generation_timeout_s=...), None = no limit)")
        exc = GenerationTimeout(msg)
        self.timeouts += 1
        first = self.hung is None
        if first:
            self.hung = msg
        if first and self.on_timeout is not None:
            self.on_timeout(exc)
        raise exc


def with_generation_timeout(engine: GenerationEngine, timeout_s: float | None,
                            on_timeout: Callable[[GenerationTimeout], None] | None = None) -> Any:
    """``engine`` behind a :class:`TimedEngine` watchdog; the engine itself when ``timeout_s`` is None."""
    if timeout_s is None:
        return engine
    return TimedEngine(engine, timeout_s, on_timeout)
