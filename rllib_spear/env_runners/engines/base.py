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
"""
from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Literal, Mapping, Sequence

import torch

if TYPE_CHECKING:
    from .batching import BatchingScheduler
    from .update_gate import WeightUpdateGate

__all__ = ["SamplingConfig", "GenerationOutput", "GenerationEngine"]


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
    #: The default ``agenerate``'s batching (engines/batching.py): a batch closes once no request
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
