"""KV caches for the HF engine's decode loop.

transformers' ``DynamicCache`` appends each step's keys and values with ``torch.cat``, which copies
the whole cache of every layer at every step: for a batch of B rows, H heads of d, L cached
positions and N layers that is 2 * N * B * H * L * d floats per generated token, O(L^2) over a
completion, and on a small model on CPU a large part of the decode (the 5.3M-parameter model of
benchmarks/vs_trl.py: ~100 MB copied per step at L ~ 150). ``PreallocatedLayer`` writes each
step into a buffer sized once for the prompt plus the longest completion and hands attention a
view of the filled positions, so a step copies only its own keys and values.

``KV_CACHES`` names the two kinds (``HFEngine(kv_cache=...)``): ``"preallocated"`` (default) and
``"dynamic"`` (transformers' own, the reference the tests compare against).
"""
from __future__ import annotations

from typing import Callable

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ...registry import Registry

__all__ = ["PreallocatedLayer", "preallocated_cache", "dynamic_cache", "KV_CACHES", "make_kv_cache"]


class PreallocatedLayer(DynamicLayer):
    """A full-attention cache layer over a [B, H, capacity, d] buffer; ``keys`` / ``values`` are
    views of its first ``length`` positions. Grows (doubling) if a step would overflow, so a
    wrong capacity costs a copy, never a wrong result."""

    _layer_type = None  # never registered in transformers' layer-type mappings

    def __init__(self, capacity: int, **kwargs):
        super().__init__(**kwargs)
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 position, got {capacity}")
        self.capacity = int(capacity)
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._len = 0

    def _view(self) -> None:
        self.keys = self._k[:, :, : self._len]
        self.values = self._v[:, :, : self._len]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        q = key_states.shape[-2]
        need = self._len + q
        if self._k is None or need > self._k.shape[2]:
            cap = max(need, self.capacity if self._k is None else 2 * self._k.shape[2])
            b, h, _, d = key_states.shape
            k = key_states.new_empty((b, h, cap, d))
            v = value_states.new_empty((b, h, cap, value_states.shape[-1]))
            if self._len:
                k[:, :, : self._len] = self._k[:, :, : self._len]
                v[:, :, : self._len] = self._v[:, :, : self._len]
            self._k, self._v = k, v
        self._k[:, :, self._len : need] = key_states
        self._v[:, :, self._len : need] = value_states
        self._len = need
        self._view()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._len

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices`` (rows that finished leave the batch)."""
        if self._k is not None:
            self._k, self._v = self._k[indices], self._v[indices]
            self._view()

    def reset(self) -> None:
        self._k = self._v = None
        self._len = 0
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("PreallocatedLayer does not crop (the HF engine never asks)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("PreallocatedLayer does not repeat rows (the HF engine never asks)")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("PreallocatedLayer does not reorder rows (no beam search in the HF engine)")


def dynamic_cache(model, capacity: int) -> DynamicCache:
    """transformers' ``DynamicCache`` (``capacity`` unused)."""
    return DynamicCache(config=model.config)


def preallocated_cache(model, capacity: int) -> DynamicCache:
    """A ``DynamicCache`` whose full-attention layers are :class:`PreallocatedLayer` of
    ``capacity`` positions (prompt + longest completion); other layer kinds (sliding window)
    keep transformers' own."""
    cache = DynamicCache(config=model.config)
    cache.layers = [PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


KV_CACHES: Registry = Registry("kv_cache", register_hint="rllib_spear.env_runners.engines.kv_cache.KV_CACHES.register")
KV_CACHES.register("preallocated", preallocated_cache)
KV_CACHES.register("dynamic", dynamic_cache)


def make_kv_cache(kind: str, model, capacity: int) -> DynamicCache:
    """The cache ``kind`` of :data:`KV_CACHES` for ``model``, sized for ``capacity`` positions."""
    factory: Callable = KV_CACHES.get(kind)
    return factory(model, capacity)
