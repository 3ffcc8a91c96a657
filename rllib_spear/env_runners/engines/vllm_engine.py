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
"""
from __future__ import annotations

import json
import logging
import os
import random
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

import torch

from ...models.dtypes import dtype_name
from .base import GenerationEngine, GenerationOutput, SamplingConfig

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


def _reload(worker, items):
    worker.reload_weights(weights_iterator=items)


def _load_weights(worker, items):
    worker.model_runner.model.load_weights(weights=items)


def _repack_lm_head(worker):
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    dispatch_cpu_unquantized_gemm(worker.model_runner.model.lm_head, remove_weight=False)


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
        seed: engine seed (per-request seeds come from ``SamplingConfig.seed``).
        max_model_len: context length; default ``min(config.max_position_embeddings, 4096)``.
        update_method: ``"reload"`` (vLLM ``reload_weights``, default) or ``"load_weights"``
            (``model.load_weights``; GPU only, the CPU backend pre-packs weights).
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
        llm_kwargs.setdefault("enforce_eager", on_cpu)
        llm_kwargs.setdefault("enable_prefix_caching", True)
        if on_cpu:
            # vLLM's CPU sampler fails on a seeded request whose prefill is split over scheduler
            # steps ("CPU Generator does not use offset"). A large per-step token budget plus
            # ``generate`` splitting the batch by it keeps every prefill in one step.
            llm_kwargs.setdefault("max_num_batched_tokens", max(_CPU_PREFILL_BUDGET, max_model_len))
        self.prefill_budget = int(llm_kwargs["max_num_batched_tokens"]) if on_cpu else None
        self.llm = LLM(
            model=self.model_path,
            dtype=dtype_name(dtype),
            seed=seed,
            max_model_len=max_model_len,
            logprobs_mode="processed_logprobs",
            **llm_kwargs,
        )
        self.max_model_len = max_model_len
        self.tokenizer = self.llm.get_tokenizer()
        self.version = 0
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

        sampling.validate()
        # greedy (temperature 0): vLLM takes the argmax and ignores top-p/top-k and the seed
        truncated = not sampling.greedy and (sampling.top_p < 1.0 or (sampling.top_k or -1) > 0)
        if truncated and not self._warned_truncation:
            logger.warning(
                "VLLMEngine: with top_p/top_k on, vLLM's log-probs are renormalised over the kept "
                "tokens (processed_logprobs), unlike the HF engine's full-softmax convention."
            )
            self._warned_truncation = True
        n = len(prompts)
        if max_new_tokens is not None and len(max_new_tokens) != n:
            raise ValueError(f"max_new_tokens has {len(max_new_tokens)} entries for {n} prompts")
        caps = [
            min(sampling.max_new_tokens, int(max_new_tokens[i])) if max_new_tokens is not None else sampling.max_new_tokens
            for i in range(n)
        ]
        # One seed per request, derived from the batch seed, so that repeated prompts (a GRPO
        # group) get different samples while the batch stays reproducible.
        base = sampling.seed if sampling.seed is not None else random.SystemRandom().randrange(2**62)
        rng = random.Random(base)
        seeds = [rng.randrange(2**62) for _ in range(n)]
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
                comp = res.outputs[0]
                ids = list(comp.token_ids)
                lps = [float(d[t].logprob) for t, d in zip(ids, comp.logprobs)]
                reason = "stop" if comp.finish_reason == "stop" else "length"
                outputs[i] = GenerationOutput(ids, lps, reason)
        return outputs  # type: ignore[return-value]

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
        self._load(list(self._items(state_dict.items())))
        self.version = int(version)

    def load_weights_stream(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """One in-place load over a stream of HF-named tensors, consumed lazily by the weight
        loader when the engine runs in this process (else collected first), then the same tied
        head re-pack and prefix-cache reset as ``update_weights``; the version is left alone."""
        items = self._items(named_tensors)
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
            items = list(items)  # an engine-core subprocess gets the arguments pickled
        self._load(items)

    def _items(self, pairs: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for k, v in pairs:
            if not (self.tie_word_embeddings and k == "lm_head.weight"):
                yield k, (v.detach() if isinstance(v, torch.Tensor) else torch.as_tensor(v))

    def _load(self, items) -> None:
        if self.update_method == "reload":
            self.llm.collective_rpc(_reload, args=(items,))
        else:
            self.llm.collective_rpc(_load_weights, args=(items,))
        if self.on_cpu and self.tie_word_embeddings:
            self.llm.collective_rpc(_repack_lm_head)
        self.llm.reset_prefix_cache()

    def shutdown(self) -> None:
        llm = getattr(self, "llm", None)
        self.llm = None
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # pragma: no cover - best effort
                pass
