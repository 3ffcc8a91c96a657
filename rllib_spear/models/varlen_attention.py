"""``attn_implementation="sdpa_varlen"``: attention over a packed row without an N x N mask.

A packed micro-batch (models/packing.py) is one row [1, N] holding several documents (the
micro-batch's rows), with position ids that restart at 0 at each document's first token. Under
"sdpa" transformers masks it with a dense [1, 1, N, N] boolean mask, which SDPA turns into a float
bias in every layer: N^2 scores computed and (without checkpointing) N^2 bias elements saved,
where the documents need only the sum of their L^2 (docs/design.md "Packed micro-batches").

This kernel computes each document's causal attention apart, with torch's own SDPA and
``is_causal=True`` (no mask tensor): for documents at [s_0, s_1), [s_1, s_2), ... of the packed
row,

    out[:, :, s_i:s_{i+1}] = SDPA(q[:, :, s_i:s_{i+1}], k[:, :, s_i:s_{i+1}], v[:, :, s_i:s_{i+1}], causal)

which is exactly the block-diagonal causal attention of the dense mask. On a GPU in bf16/fp16
the documents go to SDPA as one nested (jagged) tensor, which torch runs as one varlen flash
kernel over the documents' offsets (``torch.nested.nested_tensor_from_jagged``); elsewhere (CPU,
float32, where torch has no causal jagged kernel) as one SDPA call per document. The document starts are
where the position ids do not step by +1 (transformers' packed-sequence rule). Anything else (a
padded batch with a mask, a batch of several rows, no position ids, keys from a KV cache) runs
transformers' "sdpa" unchanged, so a model loaded with this kernel also scores and generates.

Registered with transformers' ``AttentionInterface`` and ``AttentionMaskInterface`` on import
(``load_causal_lm`` imports it when asked for ``VARLEN_ATTENTION``). Its mask function builds no
mask where transformers would build the packed one (no 2D mask given), and sdpa's mask where a
2D mask is given.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["VARLEN_ATTENTION", "document_bounds", "varlen_sdpa_attention", "nested_causal_sdpa", "use_nested",
           "register"]

#: The ``attn_implementation`` name of this kernel.
VARLEN_ATTENTION = "sdpa_varlen"

#: Whether CUDA bf16/fp16 packed rows use the one-kernel jagged path (else one call per document).
NESTED_ON_CUDA = True

_bounds_cache: tuple[Any, list[int]] | None = None  # (position ids tensor, its bounds): one per forward
_nested_failed = False  # the jagged path raised once in this process: one call per document from then on


def document_bounds(position_ids: torch.Tensor) -> list[int]:
    """[s_0 = 0, s_1, ..., s_D = N]: where the documents of a packed row [1, N] start (a position
    that is not the previous one + 1), and its end. One host sync per distinct tensor: the layers
    of one forward share their ``position_ids`` and reuse the result."""
    global _bounds_cache
    if _bounds_cache is not None and _bounds_cache[0] is position_ids:
        return _bounds_cache[1]
    pos = position_ids.reshape(-1)
    n = int(pos.numel())
    starts = (torch.nonzero(pos[1:] != pos[:-1] + 1).reshape(-1) + 1).tolist() if n > 1 else []
    bounds = [0, *starts, n]
    _bounds_cache = (position_ids, bounds)
    return bounds


def varlen_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                          sliding_window: int | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Causal attention per document of a packed row (see the module docstring); transformers'
    attention-function contract: ``query`` [B, H, T, d], ``key``/``value`` [B, K, T, d] (K divides
    H), returns ([B, T, H, d], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    position_ids = kwargs.get("position_ids")
    if (attention_mask is not None or position_ids is None or query.shape[0] != 1 or query.shape[2] < 2
            or key.shape[2] != query.shape[2]):  # a mask, several rows, or a KV cache: transformers' sdpa
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      sliding_window=sliding_window, **kwargs)
    if sliding_window is not None:
        raise NotImplementedError(f"attn_implementation={VARLEN_ATTENTION!r} computes full causal attention per "
                                  "document; this layer uses a sliding window: load the model with 'sdpa' or "
                                  "'flex_attention' instead")
    if key.shape[1] != query.shape[1]:  # GQA: the flash kernel takes as many k/v heads as q heads
        rep = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    bounds = document_bounds(position_ids)
    p = dropout if module.training else 0.0
    if len(bounds) == 2:
        out = F.scaled_dot_product_attention(query, key, value, dropout_p=p, is_causal=True, scale=scaling)
        return out.transpose(1, 2).contiguous(), None
    if use_nested(query):
        try:
            return nested_causal_sdpa(query, key, value, bounds, dropout=p, scale=scaling), None
        except RuntimeError as e:  # a kernel this GPU / torch lacks: the exact per-document path
            _fall_back(e)
    out = torch.cat([F.scaled_dot_product_attention(query[:, :, s:e], key[:, :, s:e], value[:, :, s:e],
                                                    dropout_p=p, is_causal=True, scale=scaling)
                     for s, e in zip(bounds[:-1], bounds[1:])], dim=2)
    return out.transpose(1, 2).contiguous(), None


def use_nested(query: torch.Tensor) -> bool:
    """The jagged one-kernel path: CUDA, half precision (flash varlen), not switched off."""
    return (NESTED_ON_CUDA and not _nested_failed and query.is_cuda
            and query.dtype in (torch.bfloat16, torch.float16))


def _fall_back(error: Exception) -> None:
    global _nested_failed
    _nested_failed = True
    import logging

    logging.getLogger(__name__).warning(
        "sdpa_varlen: the jagged SDPA path failed (%s); one SDPA call per document from now on", error)


def nested_causal_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bounds: list[int], *,
                       dropout: float = 0.0, scale: float | None = None) -> torch.Tensor:
    """Causal SDPA of each document of a packed row in one call on jagged tensors: ``query``,
    ``key``, ``value`` [1, H, N, d] (equal heads), ``bounds`` the documents' offsets; returns
    [1, N, H, d], the documents' outputs in their packed places."""
    offsets = torch.tensor(bounds, dtype=torch.int64, device=query.device)

    def jagged(x: torch.Tensor) -> torch.Tensor:  # [1, H, N, d] -> [docs, H, j, d]
        return torch.nested.nested_tensor_from_jagged(x[0].transpose(0, 1).contiguous(), offsets).transpose(1, 2)

    out = F.scaled_dot_product_attention(jagged(query), jagged(key), jagged(value), dropout_p=dropout,
                                         is_causal=True, scale=scale)
    return out.transpose(1, 2).values().unsqueeze(0)  # [docs, j, H, d] -> values [N, H, d] -> [1, N, H, d]


def _varlen_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                 mask_function: Any = None, attention_mask: torch.Tensor | None = None, **kwargs: Any):
    """No mask for a row without a 2D mask (the kernel reads the documents from the position
    ids); sdpa's mask where a 2D (padding) mask is given."""
    if attention_mask is None:
        return None
    from transformers.masking_utils import sdpa_mask

    kw = {} if mask_function is None else {"mask_function": mask_function}
    return sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, attention_mask=attention_mask,
                     **kw, **kwargs)


def register() -> str:
    """Register the kernel and its mask function with transformers (idempotent); its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN_ATTENTION, varlen_sdpa_attention)
    AttentionMaskInterface.register(VARLEN_ATTENTION, _varlen_mask)
    return VARLEN_ATTENTION


register()
