"""Padding-free packing of a micro-batch: the real tokens of every row in one row, and back.

A learner micro-batch is [B, T] rows padded to the longest (left or right). ``pack_rows`` keeps
its real tokens (``attention_mask == 1``) in row-major order as one row [1, N] with position ids
that restart at 0 at each row's first real token (what the padded path gives those tokens:
``logprobs.position_ids_from_mask``). Run through a transformers body with
``attention_mask=None``, such a row gets a block-diagonal causal mask, one block per original
row: transformers' ``masking_utils.find_packed_sequence_indices`` starts a new document wherever
the position ids do not step by +1 (for the "sdpa", "eager" and "flex_attention" masks;
``PACKED_ATTENTION``). ``unpack_rows`` puts the body's [1, N, ...] outputs back at their [B, T]
places (zeros at padding), so the head and the log-softmax see exactly what the padded path gave
them at every real position. tests/models/test_packed_logprobs.py checks that values and
gradients equal the padded ones and that without the restarting positions they do not.

``check_packable`` refuses a model whose attention would not build that mask (the knob it names
is the learner's ``packed_microbatches``, docs/design.md "Packed micro-batches").
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

__all__ = ["PACKED_ATTENTION", "PackedRows", "pack_rows", "unpack_rows", "check_packable"]

#: The attention implementations whose mask transformers builds block-diagonal from restarting
#: position ids (masking_utils: the packed-sequence mask is and-ed into their mask function).
#: "sdpa_varlen" (models/varlen_attention.py) reads the documents from the position ids and
#: builds no mask at all.
#: "flash_attention_*" reads packed position ids through its own varlen path instead; it is not
#: listed because nothing here tests it (it needs the flash-attn package, which this project
#: does not install).
PACKED_ATTENTION = ("sdpa", "eager", "flex_attention", "sdpa_varlen")


@dataclass(frozen=True)
class PackedRows:
    """One packed row of a [B, T] micro-batch.

    ``input_ids`` / ``position_ids``: [1, N], the N real tokens in row-major order, positions
    restarting at 0 for each row. ``real``: [B, T] bool, where those tokens came from (the row-
    major order of ``real``'s True entries is the packed order)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    real: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PackedRows:
    """The real tokens of ``input_ids`` [B, T] (``attention_mask`` [B, T] nonzero) as one row.

    Position of a real token: the number of real tokens before it in its row (left and right
    padding give the same positions, as ``logprobs.position_ids_from_mask`` does)."""
    if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
        raise ValueError(f"pack_rows: input_ids and attention_mask must both be [B, T], got "
                         f"{tuple(input_ids.shape)} and {tuple(attention_mask.shape)}")
    real = attention_mask.bool()
    positions = real.long().cumsum(-1) - 1
    return PackedRows(input_ids=input_ids[real].unsqueeze(0), position_ids=positions[real].unsqueeze(0),
                      real=real)


def unpack_rows(packed: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """[1, N, *F] values of a packed row -> [B, T, *F] at the ``real`` [B, T] positions they came
    from, zeros at padding (differentiable: the gradient of each padded place flows to its
    packed token)."""
    if packed.shape[0] != 1 or packed.shape[1] != int(real.sum()):
        raise ValueError(f"unpack_rows: expected [1, {int(real.sum())}, ...] values (one packed row of the "
                         f"real tokens), got {tuple(packed.shape)}")
    out = packed.new_zeros((*real.shape, *packed.shape[2:]))
    out[real] = packed[0]
    return out


def check_packable(model: torch.nn.Module) -> None:
    """Raise ValueError unless ``model`` (an HF causal LM, optionally PEFT-wrapped) builds a
    block-diagonal causal mask from packed position ids: an attention implementation of
    ``PACKED_ATTENTION`` in a modeling module that makes its mask with transformers'
    ``masking_utils.create_causal_mask`` (older or custom modeling code with its own mask would
    let the packed rows attend to each other)."""
    from .logprobs import unwrap_causal_lm

    lm = unwrap_causal_lm(model)
    impl = getattr(getattr(lm, "config", None), "_attn_implementation", None)
    if impl not in PACKED_ATTENTION:
        raise ValueError(
            f"packed_microbatches=True needs an attention implementation that masks packed rows from their "
            f"position ids, one of {PACKED_ATTENTION}; {type(lm).__name__} runs {impl!r}. Load the model with "
            "attn_implementation='sdpa' (or 'flex_attention'), or set .learners(packed_microbatches=False)")
    body = getattr(lm, getattr(lm, "base_model_prefix", ""), None)  # where the mask is built
    body = lm if body is None else body
    if not any(getattr(sys.modules.get(c.__module__), "create_causal_mask", None) is not None
               for c in type(body).__mro__):
        raise ValueError(
            f"packed_microbatches=True needs a model whose modeling code builds its mask with "
            f"transformers.masking_utils.create_causal_mask (it detects the packed rows); "
            f"{type(body).__name__} ({type(body).__module__}) does not: set .learners(packed_microbatches=False)")
