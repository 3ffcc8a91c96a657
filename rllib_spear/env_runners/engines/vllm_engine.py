"""The vLLM generation engine: ``vllm.LLM`` in-process, token-id prompts, versioned weight updates.

Log-probs: the engine is created with ``logprobs_mode="processed_logprobs"``, i.e. log-probs of the
sampled token after temperature scaling, which equals the project convention
(log softmax(logits / T)) whenever top-k/top-p are off. With top-k/top-p on, vLLM renormalises over
the kept tokens (its processed distribution); a warning says so once.

Weight updates (``update_weights``) use vLLM's in-place ``reload_weights`` with a weights iterator.
On the CPU backend the tied ``lm_head`` holds its own pre-packed copy of the embedding, which a
reload does not refresh; it is re-packed explicitly (otherwise the engine silently keeps sampling
from the old head: see docs/design.md, "vLLM weight updates"). The prefix cache is reset after
every update.

``async_engine=True`` runs vLLM as a continuous-batching async engine (``vllm_async.py``;
docs/design.md "vLLM async engine"): ``agenerate`` submits one request that joins the running
batch, and every other method keeps its synchronous semantics.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import random
from contextlib import contextmanager
from pathlib import Path
from typing import ContextManager, Iterable, Iterator, Mapping, Sequence

import torch

from ...models.dtypes import dtype_name
from ...models.threads import sync_thread_torch_threads
from .base import GenerationEngine, GenerationOutput, SamplingConfig
from .tensor_wire import encode_tensors

__all__ = ["VLLMEngine", "vllm_available"]

logger = logging.getLogger(__name__)


def vllm_available() -> tuple[bool, str]:
    """(True, "") when ``import vllm`` works, else (False, reason)."""
    try:
        import vllm  # noqa: F401
    except Exception as e:  # pragma: no cover - depends on the install
        return False, f"vllm cannot be imported: {type(e).__name__}: {e}"
    return True, ""


def _set_env_defaults(on_cpu: bool) -> None:
    # In-process engine: generation and weight updates run in this process (no engine-core
    # subprocess), which is what the RLlib EnvRunner actor wants and what makes
    # collective_rpc with local tensors cheap.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if on_cpu:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def _patch_cpu_kernel_scan() -> None:
    """Work around a vLLM 0.32 CPU-backend crash when numba/llvmlite is imported (the BM25
    retriever imports it): at worker init, ``triton_utils.dispatcher._rebind_kernels`` scans every
    module attribute and calls ``vars(value).get(...)``; llvmlite's ``ffi.lib`` answers any
    attribute (``__dict__`` included) with a function wrapper, so ``LLM()`` fails with
    "AttributeError: '_lib_fn_wrapper' object has no attribute 'get'". The replacement below is
    the same scan, skipping objects whose ``__dict__`` is not a dict."""
    try:
        from vllm.triton_utils import dispatcher
    except Exception:  # pragma: no cover - other vLLM versions
        return
    orig = getattr(dispatcher, "_rebind_kernels", None)
    if orig is None or getattr(orig, "_rllib_spear_safe", False):
        return
    import sys

    def _rebind_kernels(overrides):
        originals = {original: wrapper for original, wrapper in overrides}

        def lookup(value):
            for original in originals:
                if value is original:
                    return originals[original]
            return None

        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict) or not namespace:
                continue
            for attr, value in list(namespace.items()):
                wrapper = lookup(value)
                if wrapper is not None:
                    setattr(module, attr, wrapper)
                    continue
                try:
                    inst = object.__getattribute__(value, "__dict__")
                except Exception:
                    inst = None
                if not isinstance(inst, (dict, type(type.__dict__))):
                    continue
                wrapper = lookup(inst.get("kernel"))
                if wrapper is None:
                    continue
                value.kernel = wrapper
                if not isinstance(value, type):
                    value.__dict__.pop("_kernel_arg_names", None)

    _rebind_kernels._rllib_spear_safe = True
    dispatcher._rebind_kernels = _rebind_kernels


def _check_worker_extension(qualname: str) -> None:
    """A user's ``worker_extension_cls`` must keep this project's worker methods (the engine
    calls them by name): it must subclass ``vllm_worker.WorkerExtension``."""
    import importlib

    from .vllm_worker import WorkerExtension

    module, _, name = qualname.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except Exception as e:
        raise ValueError(f"engine_kwargs['worker_extension_cls']={qualname!r} cannot be imported: {e}") from e
    if not (isinstance(cls, type) and issubclass(cls, WorkerExtension)):
        raise ValueError(f"engine_kwargs['worker_extension_cls']={qualname!r} must subclass "
                         "rllib_spear.env_runners.engines.vllm_worker.WorkerExtension (the engine calls its "
                         "methods inside the vLLM workers)")


#: Default per-step token budget (``max_num_batched_tokens``) of the CPU backend.
_CPU_PREFILL_BUDGET = 32768


def prefill_waves(prompt_lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Split request indices, in order, into consecutive waves whose prompt tokens sum to at most
    ``budget`` (a prompt longer than ``budget`` gets a wave of its own), so that every prefill of a
    wave fits in one scheduler step."""
    waves: list[list[int]] = []
    used = budget + 1
    for i, n in enumerate(prompt_lengths):
        if used + n > budget:
            waves.append([])
            used = 0
        waves[-1].append(i)
        used += n
    return waves


class VLLMEngine(GenerationEngine):
    """Sample completions with an in-process ``vllm.LLM``.

    Args:
        model_path: a ``save_pretrained`` folder (config, safetensors, tokenizer).
        dtype: vLLM dtype (``"float32"`` matches the HF reference exactly; ``"bfloat16"`` on GPU).
        seed: engine seed (each batch's sampling seed comes from ``SamplingConfig.seed``).
        per_request_seeds: give every request its own seed (reproducible per request whatever
            the batch around it, but vLLM's sampler then loops over per-request generators at
            every decode step). Default: the workers' generator is seeded once per batch, and
            an ``agenerate`` request draws from it (its seed is not passed to vLLM).
        max_model_len: context length; default ``min(config.max_position_embeddings, 4096)``.
        update_method: ``"reload"`` (vLLM ``reload_weights``, default) or ``"load_weights"``
            (``model.load_weights``; GPU only, the CPU backend pre-packs weights).
        weight_transfer_backend: build the engine for vLLM's weight-transfer API with this
            backend (``"nccl"``, ``"ipc"`` or ``"rllib_spear_gloo"``, the CPU one:
            ``weight_streaming/vllm_transfer.py``); None: no transfer engine.
        stream_chunk_bytes: when a weight stream must be pickled to the workers (a multiprocess
            engine or executor, e.g. tensor parallelism), it goes in calls of at most this many
            bytes inside one layerwise reload.
        async_engine: run vLLM as an async engine with continuous batching on a thread of its own
            (``vllm_async.py``): vLLM's ``AsyncLLM`` when the engine core runs in its own process
            (``VLLM_ENABLE_V1_MULTIPROCESSING=1``), else the in-process ``LLMEngine`` stepped
            from that thread. ``agenerate`` then submits one request to it; the other methods
            keep their semantics.
        **llm_kwargs: passed to ``vllm.LLM`` (e.g. ``gpu_memory_utilization``, ``enforce_eager``).
    """

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "float32",
        seed: int = 0,
        max_model_len: int | None = None,
        update_method: str = "reload",
        weight_transfer_backend: str | None = None,
        stream_chunk_bytes: int = 256 * 2**20,
        per_request_seeds: bool = False,
        async_engine: bool = False,
        **llm_kwargs,
    ):
        on_cpu = not torch.cuda.is_available()
        _set_env_defaults(on_cpu)
        from vllm import LLM

        if on_cpu:
            _patch_cpu_kernel_scan()

        self.model_path = str(model_path)
        self.on_cpu = on_cpu
        cfg = json.loads((Path(model_path) / "config.json").read_text())
        self.tie_word_embeddings = bool(cfg.get("tie_word_embeddings", False))
        if max_model_len is None:
            max_model_len = min(int(cfg.get("max_position_embeddings", 2048)), 4096)
        if update_method not in ("reload", "load_weights"):
            raise ValueError(f"update_method must be 'reload' or 'load_weights', got {update_method!r}")
        if update_method == "load_weights" and on_cpu:
            raise ValueError("update_method='load_weights' does not work on vLLM's CPU backend; use 'reload'")
        self.update_method = update_method
        self.stream_chunk_bytes = int(stream_chunk_bytes)
        self.per_request_seeds = bool(per_request_seeds)
        self.weight_transfer_backend = weight_transfer_backend
        # the engine's worker-side calls are methods of this extension, called by name (a
        # function cannot reach a multiprocess engine core); importing it registers the gloo
        # weight-transfer backend in each worker process (vllm_worker.py)
        from .vllm_worker import WORKER_EXTENSION

        given = llm_kwargs.setdefault("worker_extension_cls", WORKER_EXTENSION)
        if given != WORKER_EXTENSION:
            _check_worker_extension(given)
        if weight_transfer_backend is not None:
            llm_kwargs["weight_transfer_config"] = {"backend": weight_transfer_backend}
        llm_kwargs.setdefault("enforce_eager", on_cpu)
        llm_kwargs.setdefault("enable_prefix_caching", True)
        if on_cpu:
            # vLLM's CPU sampler fails on a seeded request whose prefill is split over scheduler
            # steps ("CPU Generator does not use offset"). A large per-step token budget plus
            # ``generate`` splitting the batch by it keeps every prefill in one step.
            llm_kwargs.setdefault("max_num_batched_tokens", max(_CPU_PREFILL_BUDGET, max_model_len))
            if async_engine:
                # requests arrive at any time, so no wave split can keep prefills within one step:
                # a prompt that does not fit in this step's budget waits for the next instead of
                # being chunked (the budget is at least max_model_len, so every prompt fits alone)
                llm_kwargs.setdefault("enable_chunked_prefill", False)
        self.prefill_budget = int(llm_kwargs["max_num_batched_tokens"]) if on_cpu else None
        self.async_engine = bool(async_engine)
        self._update_paused = False  # async mode: the engine is paused for a weight update
        engine_args = dict(dtype=dtype_name(dtype), seed=seed, max_model_len=max_model_len,
                           logprobs_mode="processed_logprobs", **llm_kwargs)
        # vLLM-cpu checks that a step's attention runs with the OpenMP thread count it was
        # scheduled for: every thread that steps the engine first takes torch's count
        # (models/threads.py), this one (it profiles the engine) included
        sync_thread_torch_threads()
        if async_engine:
            from .vllm_async import build_handle

            own_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0"
            self.llm = build_handle(self.model_path, own_process=own_process, gather=(self.gather_window_s,
                                                                                      self.max_gather_s),
                                    **engine_args)
        else:
            self.llm = LLM(model=self.model_path, **engine_args)
        self.max_model_len = max_model_len
        self.tokenizer = self.llm.get_tokenizer()
        self.version = 0
        self._failed_updates = 0  # weight updates that raised (their requests are labelled -1)
        self._warned_truncation = False

    # ------------------------------------------------------------------ generation
    def _params(self, sampling: SamplingConfig, max_tokens: int, seed: int | None, **extra):
        from vllm import SamplingParams

        return SamplingParams(
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k is not None else -1,
            max_tokens=max_tokens,
            stop=list(sampling.stop) or None,
            stop_token_ids=list(sampling.stop_token_ids) or None,
            include_stop_str_in_output=True,
            skip_special_tokens=False,
            spaces_between_special_tokens=False,
            logprobs=0,
            seed=seed,
            detokenize=bool(sampling.stop),  # text is only needed to match stop strings
            **extra,
        )

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[GenerationOutput]:
        from vllm.inputs import TokensPrompt

        self._check_sampling(sampling)
        sync_thread_torch_threads()  # e.g. TimedEngine's engine-call thread (models/threads.py)
        n = len(prompts)
        if max_new_tokens is not None and len(max_new_tokens) != n:
            raise ValueError(f"max_new_tokens has {len(max_new_tokens)} entries for {n} prompts")
        caps = [
            min(sampling.max_new_tokens, int(max_new_tokens[i])) if max_new_tokens is not None else sampling.max_new_tokens
            for i in range(n)
        ]
        # The batch seed: either seeds the workers' generator once (default; repeated prompts of
        # a GRPO group still differ, they draw in turn from it), or one seed per request derived
        # from it (per_request_seeds).
        base = sampling.seed if sampling.seed is not None else random.SystemRandom().randrange(2**62)
        if self.per_request_seeds:
            rng = random.Random(base)
            seeds: list[int | None] = [rng.randrange(2**62) for _ in range(n)]
        else:
            seeds = [None] * n
            self.llm.collective_rpc("rllib_spear_seed_sampler", args=(base % 2**63,))
        outputs: list[GenerationOutput | None] = [None] * n
        todo = [i for i in range(n) if caps[i] > 0]
        for i in range(n):
            if caps[i] <= 0:
                outputs[i] = GenerationOutput([], [], "length")
            elif len(prompts[i]) == 0:
                raise ValueError(f"prompt {i} is empty")
        for wave in self._waves([len(prompts[i]) for i in todo]):
            wave = [todo[j] for j in wave]
            reqs = [TokensPrompt(prompt_token_ids=[int(t) for t in prompts[i]]) for i in wave]
            params = [self._params(sampling, caps[i], seeds[i]) for i in wave]
            results = self.llm.generate(reqs, sampling_params=params, use_tqdm=False)
            for i, res in zip(wave, results):
                outputs[i] = self._output(res)
        return outputs  # type: ignore[return-value]

    def _check_sampling(self, sampling: SamplingConfig) -> None:
        sampling.validate()
        # greedy (temperature 0): vLLM takes the argmax and ignores top-p/top-k and the seed
        truncated = not sampling.greedy and (sampling.top_p < 1.0 or (sampling.top_k or -1) > 0)
        if truncated and not self._warned_truncation:
            logger.warning(
                "VLLMEngine: with top_p/top_k on, vLLM's log-probs are renormalised over the kept "
                "tokens (processed_logprobs), unlike the HF engine's full-softmax convention."
            )
            self._warned_truncation = True

    @staticmethod
    def _output(res) -> GenerationOutput:
        """A finished ``RequestOutput`` as sampled ids, their log-probs and why it stopped."""
        comp = res.outputs[0]
        ids = list(comp.token_ids)
        lps = [float(d[t].logprob) for t, d in zip(ids, comp.logprobs)]
        if comp.finish_reason in ("abort", "error"):  # cut short: not a sample to train on
            raise RuntimeError(f"VLLMEngine: the request ended with finish_reason={comp.finish_reason!r}")
        return GenerationOutput(ids, lps, "stop" if comp.finish_reason == "stop" else "length")

    def batching_member(self) -> ContextManager[None]:
        """With ``async_engine``: a member of the async handle (vllm_async.py: the in-process
        core gathers a burst of requests before it steps from idle); else the default batching's."""
        if self.async_engine:
            return self.llm.member() if self.llm is not None else contextlib.nullcontext()
        return super().batching_member()

    async def agenerate(self, prompt: Sequence[int], sampling: SamplingConfig, max_new_tokens: int,
                        seed: int | None = None) -> GenerationOutput:
        """One request, awaited from the caller's event loop. With ``async_engine`` it joins the
        running batch of vLLM's async engine at its next step; with ``per_request_seeds`` it
        samples with its own ``seed`` (None: ``sampling.seed``), else (the default, as a batch of
        :meth:`generate` does) from the workers' generator: the requests of the async loop come
        from timing-dependent batches anyway, and the per-request generators cost ~4% of a short
        call at zero tool latency on CPU (benchmarks/agent_loop_throughput.py). The output is
        built as :meth:`generate` builds it. Without ``async_engine``: the default batching over
        :meth:`generate`."""
        if not self.async_engine:
            return await super().agenerate(prompt, sampling, max_new_tokens, seed)
        from vllm.inputs import TokensPrompt

        self._check_sampling(sampling)
        cap = min(int(sampling.max_new_tokens), int(max_new_tokens))
        if cap <= 0:
            return GenerationOutput([], [], "length")
        if len(prompt) == 0:
            raise ValueError("agenerate: the prompt is empty")
        seed = seed if seed is not None else sampling.seed
        if not self.per_request_seeds:
            seed = None
        params = self._params(sampling, cap, None if seed is None else int(seed) % 2**63)
        if self.llm is None:
            raise RuntimeError("VLLMEngine was shut down")
        # The version it starts on: an update during the request freezes it and resumes it on the
        # new weights, so this is the oldest version of its tokens (engines/update_gate.py).
        version, failed = self.version, getattr(self, "_failed_updates", 0)
        res = await self.llm.agenerate(TokensPrompt(prompt_token_ids=[int(t) for t in prompt]), params)
        out = self._output(res)
        # an update that raised meanwhile resumed it on half-loaded weights: no valid version
        out.policy_version = version if getattr(self, "_failed_updates", 0) == failed else -1
        return out

    def _waves(self, lengths: list[int]) -> list[list[int]]:
        """One wave on GPU; on CPU, waves within the scheduler's per-step token budget."""
        return prefill_waves(lengths, self.prefill_budget if self.prefill_budget is not None else sum(lengths))

    def score(self, sequences: Sequence[Sequence[int]], temperature: float = 1.0) -> list[list[float]]:
        """log p(x_t | x_<t) of every token of each sequence (entry 0 is 0.0) via prompt log-probs.
        vLLM's prompt log-probs are raw (temperature 1)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if temperature != 1.0:
            raise NotImplementedError("VLLMEngine.score supports temperature 1 only (raw prompt logprobs)")
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, seed=0, detokenize=False)
        reqs = [TokensPrompt(prompt_token_ids=[int(t) for t in s]) for s in sequences]
        sync_thread_torch_threads()
        results = []
        for wave in self._waves([len(s) for s in sequences]):
            results += self.llm.generate([reqs[i] for i in wave], sampling_params=params, use_tqdm=False)
        out = []
        for seq, res in zip(sequences, results):
            row = [0.0]
            for t, d in zip(list(seq)[1:], res.prompt_logprobs[1:]):
                row.append(float(d[int(t)].logprob))
            out.append(row)
        return out

    # ------------------------------------------------------------------ weights
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load HF-named weights in place (any dtype; vLLM casts), then re-pack the tied head on
        CPU and reset the prefix cache. Sets ``self.version``."""
        with self._paused_for_update():
            self._load(list(self._items(state_dict.items())))
            self.version = int(version)

    def load_weights_stream(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """One in-place load over a stream of HF-named tensors, then the same tied head re-pack
        and prefix-cache reset as ``update_weights``; the version is left alone.

        In-process with one worker, the weight loader consumes the stream lazily. Otherwise
        (the engine core in its own process, or an ``mp`` executor for tensor parallelism) every
        ``collective_rpc`` argument is pickled, and a generator cannot be: the stream then goes
        in lists of at most ``stream_chunk_bytes`` inside one layerwise reload (start, a load
        per chunk, finish: what vLLM's own weight-transfer engines do), never whole."""
        with self._paused_for_update():
            self._load_stream(self._items(named_tensors))

    def _load_stream(self, items: Iterator[tuple[str, torch.Tensor]]) -> None:
        if not self.rpc_pickles_args:
            self._load(items)
            return
        self.llm.collective_rpc("rllib_spear_begin_reload")
        chunk: list = []
        size = 0
        for k, v in items:
            chunk.append((k, v))
            size += v.numel() * v.element_size()
            if size >= self.stream_chunk_bytes:
                self.llm.collective_rpc("rllib_spear_load_weights", args=(encode_tensors(chunk),))
                chunk, size = [], 0
        if chunk:
            self.llm.collective_rpc("rllib_spear_load_weights", args=(encode_tensors(chunk),))
        self.llm.collective_rpc("rllib_spear_end_reload")
        self._after_update()

    @property
    def rpc_pickles_args(self) -> bool:
        """Whether ``collective_rpc`` pickles its arguments: the engine core runs in its own
        process, or its executor runs workers in other processes (``tensor_parallel_size`` or
        ``pipeline_parallel_size`` > 1, or ``distributed_executor_backend`` other than "uni")."""
        own_process = (self.llm.own_process if self.async_engine
                       else os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0")
        if own_process:
            return True
        pc = self.llm.llm_engine.vllm_config.parallel_config
        return pc.world_size > 1 or pc.distributed_executor_backend not in (None, "uni")

    def _items(self, pairs: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for k, v in pairs:
            if not (self.tie_word_embeddings and k == "lm_head.weight"):
                yield k, (v.detach() if isinstance(v, torch.Tensor) else torch.as_tensor(v))

    def _load(self, items) -> None:
        if self.rpc_pickles_args:  # (a generator cannot be serialised; the streamed path chunks it)
            items = encode_tensors(items)
        if self.update_method == "reload":
            self.llm.collective_rpc("rllib_spear_reload", args=(items,))
        else:
            self.llm.collective_rpc("rllib_spear_load_weights", args=(items,))
        self._after_update()

    def _after_update(self) -> None:
        """Re-pack a tied CPU head (a reload leaves vLLM's packed copy stale) and drop cached
        prefixes computed with the old weights."""
        if self.on_cpu and self.tie_word_embeddings:
            self.llm.collective_rpc("rllib_spear_repack_lm_head")
        # (async mode: the requests in flight are preempted and go on with KV of the new weights)
        self.llm.reset_prefix_cache()

    @contextmanager
    def _paused_for_update(self):
        """Async mode: no scheduler step from the start of a weight update to its end (a step
        in between would sample from a half-loaded model or a stale tied head); the requests in
        flight wait and go on with the new weights. An update that raises resumes the engine as
        well (paused, every request in flight and every later one would hang until a sync that
        may never come), with its weights marked invalid (:meth:`_update_failed`). Sync mode: no
        request runs during an update anyway."""
        self._hold_for_update()
        try:
            yield
        except BaseException:
            self._update_failed()
            raise
        finally:
            self._release_after_update()

    def _update_failed(self) -> None:
        """A weight update raised: the model may be half-loaded, so the engine holds no valid
        version (-1: a sync of any version is applied, and the requests that ran across the
        failure are labelled -1, which the async pipeline drops and resyncs)."""
        self.version = -1
        self._failed_updates = getattr(self, "_failed_updates", 0) + 1

    def _hold_for_update(self) -> None:
        if self.async_engine and not self._update_paused:
            self.llm.pause()
            self._update_paused = True

    def _release_after_update(self) -> None:
        if self.async_engine and self._update_paused:
            self._update_paused = False
            self.llm.resume()

    # ------------------------------------------------------------------ vLLM's weight-transfer API
    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype the engine holds its weights in (what the learner casts to before sending)."""
        return self.llm.llm_engine.model_config.dtype

    @property
    def world_size(self) -> int:
        """Worker processes of this engine (TP x PP x DP): its ranks in a transfer group."""
        return int(self.llm.get_world_size(include_dp=True))

    def init_weight_transfer(self, init_info: Mapping, group_id: str | None = None) -> None:
        """Join the trainer's transfer group (every worker; blocks until all members joined);
        ``group_id`` is the caller's bookkeeping (the runner keeps it), not vLLM's."""
        self._require_transfer()
        self.llm.init_weight_transfer_engine({"init_info": dict(init_info)})

    def start_weight_update(self) -> None:
        self._require_transfer()
        self._hold_for_update()  # released by finish_weight_update, or by a step that raises
        with self._resumed_on_failure():
            self.llm.start_weight_update()

    def receive_weight_update(self, update_info: Mapping) -> None:
        """Every worker receives the tensors ``update_info`` lists from the backend's channel."""
        with self._resumed_on_failure():
            self.llm.update_weights({"update_info": dict(update_info)})

    def finish_weight_update(self, version: int) -> None:
        """Close the update (vLLM finalizes the layerwise reload), then the tied head re-pack and
        prefix-cache reset of every update, then the version."""
        with self._resumed_on_failure():
            self.llm.finish_weight_update(weight_version=str(int(version)))
            self._after_update()
        self.version = int(version)
        self._release_after_update()

    @contextmanager
    def _resumed_on_failure(self):
        """One step of a transfer-API update: if it raises, the update is over (the runner leaves
        the transfer group): the weights are invalid and the engine resumes, as in
        :meth:`_paused_for_update`."""
        try:
            yield
        except BaseException:
            self._update_failed()
            self._release_after_update()
            raise

    def shutdown_weight_transfer(self) -> None:
        if self.weight_transfer_backend is not None and self.llm is not None:
            self.llm.shutdown_weight_transfer_engine()

    def _require_transfer(self) -> None:
        if self.weight_transfer_backend is None:
            raise RuntimeError("VLLMEngine was built without weight_transfer_backend; the runner builds it "
                               "with one for weight_sync_transport='vllm'")

    def shutdown(self) -> None:
        super().shutdown()  # the default agenerate's scheduler (sync mode), before the engine
        llm = getattr(self, "llm", None)
        self.llm = None
        if llm is not None:
            try:
                if self.async_engine:
                    llm.shutdown()  # fails the requests in flight, stops the core and the loop
                else:
                    llm.llm_engine.engine_core.shutdown()
            except Exception:  # pragma: no cover - best effort
                pass

    # ------------------------------------------------------------------ sleep mode (colocated runs)
    # docs/design.md "Cluster placement". vLLM-cpu has no sleep mode, so on this project's CPU
    # machines only the no-op path runs; the GPU path follows vLLM's documented sequence (verl,
    # OpenRLHF) and is unverified here.
    _sleep_level = 0  # the level the engine sleeps at (0: awake)
    _asleep_tags: frozenset = frozenset()  # memory still asleep ("weights", "kv_cache")

    @property
    def sleep_mode(self) -> bool:
        """Whether vLLM was built with ``enable_sleep_mode=True`` (a colocated GPU runner builds it
        so: env_runners/placement.py ``runner_engine_kwargs``)."""
        engine = getattr(self.llm, "llm_engine", None)
        return bool(getattr(getattr(engine, "model_config", None), "enable_sleep_mode", False))

    def sleep(self, level: int = 1) -> bool:
        """``LLM.sleep(level)``: level 1 backs the weights up to pinned host memory and drops the
        KV cache; level 2 drops both and returns True (the next weight sync must write every
        weight; vLLM keeps the model's buffers). Without sleep mode (vLLM-cpu, where
        ``enable_sleep_mode`` raises; a GPU engine built without it) nothing is freed and this
        returns False: vLLM would only pause its scheduler."""
        super().sleep(level)
        if not self.sleep_mode:
            return False
        if not self._sleep_level:
            self.llm.sleep(level=int(level))
            self._sleep_level = int(level)
            self._asleep_tags = frozenset(("weights", "kv_cache"))
        return self._sleep_level == 2

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """``LLM.wake_up(tags)`` for the ``tags`` still asleep ("weights", then "kv_cache"; None =
        both); vLLM resumes scheduling once both are awake. An awake engine: nothing to do."""
        want = [t for t in (tags if tags is not None else ("weights", "kv_cache")) if t in self._asleep_tags]
        if not want:
            return
        self.llm.wake_up(tags=want)
        self._asleep_tags = self._asleep_tags - set(want)
        if not self._asleep_tags:
            self._sleep_level = 0
