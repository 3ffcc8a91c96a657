"""The transformers generation engine: batched, left-padded sampling with a KV cache.

The CPU default and the numerical reference. Its own decode loop (rather than
``model.generate``) gives exact control of what RL needs: the log-prob of each sampled token under
softmax(logits / T) (before top-k/top-p), stop strings checked as they complete, per-prompt token
caps, seeded sampling, and rows leave the batch (and its KV cache) as soon as they finish.

Sampling is inverse-CDF (:func:`sample_categorical`): one seeded uniform per row and step, where
``torch.multinomial`` drew one per vocabulary entry (a quarter of the decode time of a 1M-parameter
model). The random stream changed with it on 2026-12-03: the same seed gives other samples than
before, from the same distribution.

Three things keep the loop cheap without changing the random stream (the same draws, in the same
order and shape; see ``HFEngine``): identical prompts (a GRPO group's samples) are prefilled once
and their cache rows copied to every sample (``shared_prefill``), the decode steps write their
keys and values into buffers allocated once per batch (``preallocate_kv``,
:class:`PreallocatedLayer`) instead of growing the cache with a ``torch.cat`` per layer and step,
and the decode steps' padding mask is built once per batch (``HFEngine._prepared_mask``) rather
than by the model at every step.
"""
from __future__ import annotations

import random
from typing import Iterable, Mapping, Sequence

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from ...models.dtypes import torch_dtype
from .base import GenerationEngine, GenerationOutput, SamplingConfig

__all__ = ["HFEngine", "PreallocatedLayer", "RowStreams", "apply_top_k_top_p", "group_identical", "sample_categorical"]

def apply_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) logits outside the top-k and outside the smallest set with mass >= top_p.
    ``top_k = -1`` and ``top_p = 1`` disable the filters. Returns a new tensor."""
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the mass before it already reaches top_p (always keeps the first)
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, sorted_idx, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


class RowStreams:
    """One random stream per row of a batch (``SamplingConfig.row_seeds``), so a row's draws
    depend on its own seed and its own step count alone, never on the other rows of its batch.

    The uniform of row r at its step t is counter-based (no generator state to carry):

        x = splitmix64(seed_r + (t + 1) * 0x9E3779B97F4A7C15 mod 2^64),  u = (x >> 11) / 2^53

    ``splitmix64`` is the finaliser of Steele et al.'s SplitMix64: every 64-bit input maps to a
    distinct, well-mixed output, and the top 53 bits give a double uniform on [0, 1).
    """

    _MASK = (1 << 64) - 1
    _GAMMA = 0x9E3779B97F4A7C15

    def __init__(self, seeds: Sequence[int]) -> None:
        self.seeds = [int(s) & self._MASK for s in seeds]
        self.steps = [0] * len(self.seeds)

    @classmethod
    def _splitmix64(cls, x: int) -> int:
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & cls._MASK
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB & cls._MASK
        return x ^ (x >> 31)

    def uniforms(self, rows: Sequence[int]) -> list[float]:
        """The next uniform of each of ``rows`` (indices into the seeds), advancing their counters."""
        out = []
        for r in rows:
            self.steps[r] += 1
            x = self._splitmix64((self.seeds[r] + self.steps[r] * self._GAMMA) & self._MASK)
            out.append((x >> 11) * (1.0 / (1 << 53)))
        return out

    def subset(self, rows: Sequence[int]) -> "RowStreams":
        """The streams of ``rows`` (a chunk of a larger call), at step 0."""
        return RowStreams([self.seeds[r] for r in rows])


def sample_categorical(probs: torch.Tensor, gen: torch.Generator | torch.Tensor) -> torch.Tensor:
    """One draw per row of the categorical distributions ``probs`` ``[rows, vocab]`` (rows need
    not sum to 1; zeros are never drawn), by inverse-CDF sampling from one uniform per row:

        C_j = sum_{i <= j} p_i (in float64),  u ~ U[0, 1),  token = min{j : C_j > u * C_V}

    so P(token = j) = p_j / C_V. ``gen`` is the generator u is drawn from, or the uniforms
    themselves (``[rows]`` float64, :class:`RowStreams`). ``torch.multinomial`` draws one random number per vocabulary
    entry per row; this draws one per row (the decode loop's largest cost on small models).
    A token of zero mass (top-k/top-p masked, a -inf logit) has C_j == C_{j-1} exactly (adding
    0.0 is exact), so ``C_j > u * C_V >= C_{j-1}`` never holds for it; ``u * C_V`` rounded up to
    ``C_V`` would give ``vocab``, hence the clamp to the last token of nonzero mass (the first j
    with C_j == C_V).
    """
    cdf = probs.to(torch.float64).cumsum(-1)
    total = cdf[:, -1:].contiguous()  # searchsorted copies a strided query otherwise
    if isinstance(gen, torch.Tensor):
        u = gen.to(device=probs.device, dtype=torch.float64).reshape(total.shape) * total
    else:
        u = torch.rand(total.shape, generator=gen, dtype=torch.float64, device=probs.device) * total
    idx = torch.searchsorted(cdf, u, right=True)
    last = torch.searchsorted(cdf, total)
    return torch.minimum(idx, last).squeeze(-1)


def group_identical(prompts: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """Find the identical prompts of a batch (a GRPO group's samples share one).

    Returns ``(first, group)``: the index of each distinct prompt's first occurrence, in batch
    order, and for every prompt the position of its distinct prompt in ``first``.
    """
    seen: dict[tuple[int, ...], int] = {}
    first: list[int] = []
    group: list[int] = []
    for i, p in enumerate(prompts):
        g = seen.setdefault(tuple(p), len(first))
        if g == len(first):
            first.append(i)
        group.append(g)
    return first, group


class PreallocatedLayer(DynamicLayer):
    """One full-attention layer's keys and values in buffers sized for the whole generation.

    ``DynamicLayer`` appends a decode step's keys and values with ``torch.cat``, which copies the
    layer's whole cache at every step; here a step writes its slot in place and ``keys`` /
    ``values`` are views of the filled part. Attention reads the same numbers as from the
    concatenated tensors, so the outputs are bitwise those of ``DynamicLayer`` (tested on CPU).

    Args:
        keys, values: the prefilled states, ``[batch, heads, length, head_dim]``.
        capacity: the sequence length to allocate (a longer sequence grows the buffers).
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self._len = keys.shape[-2]
        self._k = self._buffer(keys, capacity)
        self._v = self._buffer(values, capacity)
        self.is_initialized = True
        self._expose()

    def _buffer(self, states: torch.Tensor, capacity: int) -> torch.Tensor:
        """A ``capacity``-long buffer holding ``states`` (the first ``self._len`` positions)."""
        b, h, n, d = states.shape
        buf = states.new_empty((b, h, max(capacity, n), d))
        buf[:, :, :n] = states
        return buf

    def _expose(self) -> None:
        # views, not copies: what the attention and ``get_seq_length`` read
        self.keys, self.values = self._k[:, :, : self._len], self._v[:, :, : self._len]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new states after the cached ones; returns the keys and values so far."""
        start, end = self._len, self._len + key_states.shape[-2]
        if end > self._k.shape[-2]:  # past the planned length: double (amortised, not per step)
            self._k = self._buffer(self.keys, max(end, 2 * self._k.shape[-2]))
            self._v = self._buffer(self.values, self._k.shape[-2])
        self._k[:, :, start:end] = key_states
        self._v[:, :, start:end] = value_states
        self._len = end
        self._expose()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the rows ``indices`` (rows that finished leave the batch)."""
        self._k, self._v = self._k[indices], self._v[indices]
        self._expose()


class HFEngine(GenerationEngine):
    """Sample completions from a transformers causal LM.

    In a runner that holds a GPU the engine samples on ``cuda`` (env_runners/placement.py
    ``engine_device``). Colocated runs: ``sleep`` moves the model to host memory (at both levels:
    the weight sync copies into the parameters in place, so keeping them costs one host copy and
    saves re-allocating them) and ``wake_up(["weights"])`` moves it back; there is no KV cache to
    free between calls (each ``generate`` builds its own). On a CPU engine both do nothing.

    Args:
        model_path: a ``save_pretrained`` folder (model and tokenizer), unless ``model`` and
            ``tokenizer`` are given.
        model, tokenizer: an already loaded model/tokenizer (e.g. the learner's, for tests).
        dtype: weights dtype when loading (``"float32"`` default; ``"bfloat16"`` on GPU).
        device: ``"cpu"`` or ``"cuda"``.
        max_batch_size: split larger ``generate`` calls into chunks of this many prompts.
        shared_prefill: prefill each distinct prompt of a batch once and copy its cache rows to
            the prompt's every occurrence (the samples of a group), rather than once per row.
        preallocate_kv: decode into :class:`PreallocatedLayer` buffers sized for the batch's
            longest generation (when every layer is a plain full-attention ``DynamicLayer``;
            others keep the growing cache). Both are on by default and leave the random stream
            as it is; they are switches for tests and comparisons. The preallocated cache gives
            bitwise the outputs of the growing one; the shared prefill gives the same numbers
            up to the rounding of a matrix product of another shape (a prompt prefilled alone
            can move its first token's log-prob by ~1e-7).
    """

    def __init__(
        self,
        model_path: str | None = None,
        *,
        model=None,
        tokenizer=None,
        dtype="float32",
        device: str | torch.device = "cpu",
        max_batch_size: int | None = None,
        attn_implementation: str | None = "sdpa",
        shared_prefill: bool = True,
        preallocate_kv: bool = True,
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if model is None:
            if model_path is None:
                raise ValueError("HFEngine needs model_path or model")
            kw = {"attn_implementation": attn_implementation} if attn_implementation else {}
            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype(dtype), **kw)
        if tokenizer is None:
            src = model_path or getattr(model, "name_or_path", None)
            if src is None:
                raise ValueError("HFEngine needs a tokenizer (or model_path to load it from)")
            tokenizer = AutoTokenizer.from_pretrained(src)
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.shared_prefill = shared_prefill
        self.preallocate_kv = preallocate_kv
        self.version = 0
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
        self.pad_token_id = int(pad)
        eos: set[int] = set()
        for src in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
            if src is None:
                continue
            eos.update([src] if isinstance(src, int) else list(src))
        self.eos_token_ids = sorted(eos)
        backend = getattr(tokenizer, "_tokenizer", None)
        self._decode_batch = (
            (lambda seqs: backend.decode_batch(seqs, skip_special_tokens=False))
            if backend is not None and hasattr(backend, "decode_batch")
            else (lambda seqs: tokenizer.batch_decode(seqs, skip_special_tokens=False))
        )

    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype the model holds its floating weights in (the weight sync sends in it)."""
        return next((p.dtype for p in self.model.parameters() if p.is_floating_point()), torch.float32)

    # ------------------------------------------------------------------ generation
    @torch.inference_mode()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[GenerationOutput]:
        if self._asleep:
            raise RuntimeError("HFEngine.generate: the engine is asleep (sleep() without wake_up(['weights'])): "
                               "its model is in host memory")
        sampling.validate()
        n = len(prompts)
        if max_new_tokens is not None and len(max_new_tokens) != n:
            raise ValueError(f"max_new_tokens has {len(max_new_tokens)} entries for {n} prompts")
        caps = [
            min(sampling.max_new_tokens, int(max_new_tokens[i])) if max_new_tokens is not None else sampling.max_new_tokens
            for i in range(n)
        ]
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty")
        if sampling.row_seeds is not None and len(sampling.row_seeds) != n:
            raise ValueError(f"SamplingConfig.row_seeds has {len(sampling.row_seeds)} seeds for {n} prompts")
        streams = RowStreams(sampling.row_seeds) if sampling.row_seeds is not None else None
        gen = torch.Generator(device=self.device)
        gen.manual_seed(sampling.seed if sampling.seed is not None else random.SystemRandom().randrange(2**63))
        outputs: list[GenerationOutput | None] = [None] * n
        todo = [i for i in range(n) if caps[i] > 0]
        for i in range(n):
            if caps[i] <= 0:
                outputs[i] = GenerationOutput([], [], "length")
        bs = self.max_batch_size or max(1, len(todo))
        for s in range(0, len(todo), bs):
            idx = todo[s : s + bs]
            res = self._generate_batch([prompts[i] for i in idx], sampling, [caps[i] for i in idx],
                                       gen if streams is None else streams.subset(idx))
            for i, r in zip(idx, res):
                outputs[i] = r
        return outputs  # type: ignore[return-value]

    def _left_pad(self, prompts: Sequence[Sequence[int]], extra: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Left-padded ``(ids, attn, pos)`` on the engine's device: ids and positions ``[n, L]``,
        the attention mask ``[n, L + extra]`` with ones after the prompts (the decode steps read
        growing slices of it instead of concatenating a column per step)."""
        n, L = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((n, L), self.pad_token_id, dtype=torch.long)
        attn = torch.ones((n, L + extra), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, L - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
            attn[i, : L - len(p)] = 0
        ids, attn = ids.to(self.device), attn.to(self.device)
        pos = (attn[:, :L].cumsum(-1) - 1).clamp_(min=0)
        return ids, attn, pos

    def _prefill(self, prompts: Sequence[Sequence[int]], extra: int
                 ) -> tuple[Cache, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One forward over the batch's prompts, each distinct prompt once (``shared_prefill``).

        Returns, one row per prompt of the batch: the cache (with room for ``extra`` more tokens
        when preallocated), the logits of the last prompt position, the attention mask (width
        prompt + ``extra``) and the last prompt position. A prefilled row's copies are the numbers
        its own prefill would give, up to the rounding of a smaller batch's matrix products.
        """
        first, group = group_identical(prompts) if self.shared_prefill else (range(len(prompts)), None)
        ids, attn, pos = self._left_pad([prompts[i] for i in first], extra)
        cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=ids, attention_mask=attn[:, : ids.shape[1]], position_ids=pos,
                         past_key_values=cache, use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1]
        index = None
        if group is not None and len(first) < len(prompts):
            index = torch.tensor(group, device=self.device)
            logits, attn, pos = logits[index], attn[index], pos[index]
        return self._decode_cache(cache, index, ids.shape[1] + extra), logits, attn, pos[:, -1]

    def _decode_cache(self, cache: Cache, index: torch.Tensor | None, capacity: int) -> Cache:
        """The prefill's cache made the decode loop's: its rows repeated by ``index`` (shared
        prefill), in :class:`PreallocatedLayer` buffers of ``capacity`` positions when every layer
        is a plain ``DynamicLayer`` (a sliding-window or other layer keeps its own growth rule)."""
        layers = cache.layers
        if self.preallocate_kv and layers and all(type(x) is DynamicLayer and x.is_initialized for x in layers):
            pick = (lambda t: t) if index is None else (lambda t: t[index])
            cache.layers = [PreallocatedLayer(pick(x.keys), pick(x.values), capacity) for x in layers]
        elif index is not None:
            cache.batch_select_indices(index)
        return cache

    @staticmethod
    def _sampling_probs(scaled: torch.Tensor, logp_full: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
        """The (unnormalised) distribution to draw from: softmax(logits / T) after top-k/top-p.
        Unfiltered, ``exp(log_softmax)`` reuses the behaviour log-probs instead of a second
        softmax (the sampler needs no normalised rows)."""
        if (sampling.top_k is None or not 0 < sampling.top_k < scaled.shape[-1]) and (
                sampling.top_p is None or sampling.top_p >= 1.0):
            return logp_full.exp()
        return torch.softmax(apply_top_k_top_p(scaled, sampling.top_k, sampling.top_p), dim=-1)

    def _prepared_mask(self, cache: Cache, attn: torch.Tensor) -> torch.Tensor | None:
        """The decode steps' attention mask built once per batch (and again when rows leave), or
        None to let the model build it from the 2D ``attn`` at every step.

        A decode step's query is the last position, so the causal mask the model would build is
        the padding mask alone: ``mask[b, 0, 0, j] = attn[b, j]`` (bool, True = attend), which
        transformers takes as is when given in 4D. That skips its per-step mask construction and
        gives the attention the same numbers. Only for SDPA over full-attention layers (a sliding
        window or an eager additive mask needs the model's own); a batch without padding returns
        an empty tensor, which :meth:`_step_mask` turns into no mask, as the model does."""
        if getattr(self.model.config, "_attn_implementation", None) != "sdpa" or not all(
                type(x) in (DynamicLayer, PreallocatedLayer) for x in cache.layers):
            return None
        if bool(attn.all()):
            return attn.new_empty((0,), dtype=torch.bool)
        return attn.bool()[:, None, None, :]

    @staticmethod
    def _step_mask(mask4: torch.Tensor, kv_len: int) -> torch.Tensor | None:
        """The first ``kv_len`` key positions of the prepared mask (None: no padding)."""
        return mask4[..., :kv_len] if mask4.numel() else None

    def _generate_batch(self, prompts, sampling: SamplingConfig, caps: list[int],
                        gen: torch.Generator | RowStreams) -> list[GenerationOutput]:
        dev = self.device
        B = len(prompts)

        stop_ids = torch.tensor(sorted(set(self.eos_token_ids) | set(sampling.stop_token_ids)), dtype=torch.long, device=dev)
        stops = [s for s in sampling.stop if s]
        tail = (max(len(s.encode("utf-8")) for s in stops) + 1) if stops else 0
        T = float(sampling.temperature)
        max_cap = max(caps)

        toks: list[list[int]] = [[] for _ in range(B)]
        lps: list[list[float]] = [[] for _ in range(B)]
        reasons: list[str] = ["length"] * B
        caps_t = torch.tensor(caps, device=dev)
        rows = torch.arange(B, device=dev)  # original row of each live batch slot

        # the last sampled token is never fed back: the cache holds at most max_cap - 1 more
        cache, logits, attn, last_pos = self._prefill(prompts, max(max_cap - 1, 0))
        mask4 = self._prepared_mask(cache, attn)
        for step in range(max_cap):
            scaled = logits.float()
            if T not in (0.0, 1.0):
                scaled = scaled / T
            logp_full = torch.log_softmax(scaled, dim=-1)
            if T == 0.0:  # greedy: the argmax (first on ties), no draw; log-probs at T = 1
                nxt = scaled.argmax(dim=-1)
            else:
                draw = gen if isinstance(gen, torch.Generator) else \
                    torch.tensor(gen.uniforms(rows.tolist()), dtype=torch.float64)
                nxt = sample_categorical(self._sampling_probs(scaled, logp_full, sampling), draw)
            lp = logp_full.gather(-1, nxt.unsqueeze(-1)).squeeze(-1)
            nxt_l, lp_l, rows_l = nxt.tolist(), lp.tolist(), rows.tolist()
            for t, l, r in zip(nxt_l, lp_l, rows_l):
                toks[r].append(t)
                lps[r].append(l)
            done = torch.isin(nxt, stop_ids)
            if stops:
                live_rows = [r for r, d in zip(rows_l, done.tolist()) if not d]
                if live_rows:
                    texts = self._decode_batch([toks[r][-tail:] for r in live_rows])
                    hit = {r for r, txt in zip(live_rows, texts) if any(s in txt for s in stops)}
                    if hit:
                        done = done | torch.tensor([r in hit for r in rows_l], device=dev)
            for r, d in zip(rows_l, done.tolist()):
                if d:
                    reasons[r] = "stop"
            done = done | (step + 1 >= caps_t[rows])
            if bool(done.all()):
                break
            keep = (~done).nonzero().squeeze(-1)
            if keep.numel() < rows.numel():
                cache.batch_select_indices(keep)
                rows, nxt, attn, last_pos = rows[keep], nxt[keep], attn[keep], last_pos[keep]
                if mask4 is not None:
                    mask4 = self._prepared_mask(cache, attn)
            last_pos = last_pos + 1
            kv_len = cache.get_seq_length() + 1  # the cached positions and this one
            out = self.model(
                input_ids=nxt.unsqueeze(-1),
                attention_mask=attn[:, :kv_len] if mask4 is None else self._step_mask(mask4, kv_len),
                position_ids=last_pos.unsqueeze(-1),
                past_key_values=cache,
                use_cache=True,
            )
            logits = out.logits[:, -1]
        return [GenerationOutput(toks[i], lps[i], reasons[i]) for i in range(B)]  # type: ignore[arg-type]

    # ------------------------------------------------------------------ scoring / weights
    @torch.inference_mode()
    def score(self, sequences: Sequence[Sequence[int]], temperature: float = 1.0) -> list[list[float]]:
        """log p(x_t | x_<t) of every token of each sequence (entry 0 is 0.0), teacher-forced."""
        from rllib_spear.models.logprobs import token_logprobs

        out = []
        for seq in sequences:
            ids = torch.as_tensor([list(seq)], dtype=torch.long, device=self.device)
            out.append(token_logprobs(self.model, ids, torch.ones_like(ids), temperature=temperature)[0].tolist())
        return out

    @torch.no_grad()
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Copy ``state_dict`` (HF parameter names, any dtype/device) into the model in place.
        Missing keys are allowed only for tied weights; unknown keys raise."""
        params = self.model.state_dict(keep_vars=True)  # includes tied aliases (lm_head.weight)
        unknown = [k for k in state_dict if k not in params]
        if unknown:
            raise KeyError(f"update_weights: unknown parameter names {unknown[:5]}")
        self._copy_in(state_dict.items(), params)
        self.version = int(version)

    @torch.no_grad()
    def load_weights_stream(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy each ``(name, tensor)`` into the model in place as it comes (a subset of the
        names is fine; an unknown name raises); the version is left alone."""
        self._copy_in(named_tensors, self.model.state_dict(keep_vars=True))

    @staticmethod
    def _copy_in(items: Iterable[tuple[str, torch.Tensor]], params: Mapping[str, torch.Tensor]) -> None:
        for k, v in items:
            dst = params.get(k)
            if dst is None:
                raise KeyError(f"update_weights: unknown parameter name {k!r}")
            t = torch.as_tensor(v) if not isinstance(v, torch.Tensor) else v
            if dst.shape != t.shape:
                raise ValueError(f"update_weights: {k} has shape {tuple(t.shape)}, expected {tuple(dst.shape)}")
            dst.copy_(t.to(device=dst.device, dtype=dst.dtype))
            del v, t  # a stream's next bucket arrives before the loop rebinds them: free this one

    # ------------------------------------------------------------------ sleep mode (colocated runs)
    _asleep = False

    def sleep(self, level: int = 1) -> bool:
        """Move the model to host memory and release the cached GPU blocks (a CPU engine: nothing
        to free). The weights are kept at both levels (see the class doc): returns False."""
        super().sleep(level)
        if self.device.type == "cpu" or self._asleep:
            return False
        self.model.to("cpu")
        self._asleep = True
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return False

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """``"weights"`` (or None) moves the model back to its device; ``"kv_cache"`` has nothing
        to reallocate."""
        if self._asleep and (tags is None or "weights" in tags):
            self.model.to(self.device)
            self._asleep = False

    def shutdown(self) -> None:
        super().shutdown()  # the agenerate scheduler first: no batch may decode without a model
        self.model = None
