"""FSDP2 layout of a Hugging Face causal LM, and the tensor helpers a learner needs on it.

``shard_causal_lm`` applies ``torch.distributed.fsdp.fully_shard`` to every transformer block and
then to the causal LM itself (the root group holds the embeddings, the final norm and the head),
so that each of the N ranks keeps 1/N of every parameter. The parameters stay in the dtype they
were loaded in (float32: the *master* weights, which the optimizer updates and keeps its state
for); with ``mixed_precision="bf16"`` each block is all-gathered in bf16 for its forward and
backward and its gradients are reduce-scattered in float32 (``MixedPrecisionPolicy(param_dtype=
bf16, reduce_dtype=fp32)``), so an update of 1e-6 x lr is not rounded away as it is on bf16
weights (benchmarks/master_weights.py). ``cpu_offload`` keeps the shards, their gradients and the
optimizer step in CPU memory (``CPUOffloadPolicy``).

Scoring: ``rllib_spear.models.logprobs.token_logprobs`` runs the decoder body and the output head
separately (the head in checkpointed chunks), never the LM's own ``forward``. The root group's
parameters are all-gathered by FSDP's pre-forward hook, so the sharded LM gets a ``score_tokens``
method registered with ``register_fsdp_forward_method``: one root "forward" around the body and
every head chunk. ``token_logprobs`` dispatches to it when it is present.

No Ray here: the learner (algorithms/grpo/learner.py) calls these on its process group.
"""
from __future__ import annotations

import types
from typing import Iterable, Iterator

import torch
from torch import nn

__all__ = [
    "SCORING_METHOD", "shard_causal_lm", "load_full_state_from_rank0", "is_sharded", "transformer_blocks", "full_tensor",
    "iter_full_state", "local_numel", "local_bytes", "global_grad_norm", "clip_grads_",
]

#: Name of the FSDP forward method ``shard_causal_lm`` adds to the root LM.
SCORING_METHOD = "score_tokens"


def transformer_blocks(lm: nn.Module) -> list[nn.Module]:
    """The repeated decoder blocks of a causal LM: the classes HF lists in ``_no_split_modules``
    (e.g. ``Qwen2DecoderLayer``), else the children of the longest ``nn.ModuleList``."""
    names = set(getattr(lm, "_no_split_modules", None) or [])
    blocks = [m for m in lm.modules() if type(m).__name__ in names]
    if blocks:
        return blocks
    lists = [m for m in lm.modules() if isinstance(m, nn.ModuleList) and len(m) > 1]
    if not lists:
        raise TypeError(f"{type(lm).__name__}: no transformer blocks found to shard "
                        "(no _no_split_modules and no nn.ModuleList)")
    return list(max(lists, key=len))


def _mp_policy(mixed_precision: str | None):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if mixed_precision is None:
        return MixedPrecisionPolicy()
    if mixed_precision == "bf16":
        # fp32 gradient reduction: summing N bf16 shards loses the low bits of small gradients.
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    raise ValueError(f"mixed_precision must be None or 'bf16', got {mixed_precision!r}")


def shard_causal_lm(model: nn.Module, *, mixed_precision: str | None = None,
                    cpu_offload: bool = False, mesh=None) -> nn.Module:
    """FSDP2-shard ``model`` (an HF ``*ForCausalLM``, optionally PEFT-wrapped) in place.

    One ``fully_shard`` group per transformer block, then the LM root (embeddings, final norm,
    head: tied weights stay in one group). Must run before the optimizer is built: it replaces
    every parameter by a ``DTensor`` shard. Returns the sharded root LM.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard, register_fsdp_forward_method

    from .logprobs import unwrap_causal_lm

    lm = unwrap_causal_lm(model)
    kwargs = {"mp_policy": _mp_policy(mixed_precision),
              "offload_policy": CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
              if cpu_offload else OffloadPolicy()}
    if mesh is not None:
        kwargs["mesh"] = mesh
    for block in transformer_blocks(lm):
        fully_shard(block, **kwargs)
    # The root is needed right after its forward (the head chunks are recomputed in backward):
    # keep it gathered between forward and backward.
    fully_shard(lm, reshard_after_forward=False, **kwargs)

    def score_tokens(self, input_ids, attention_mask=None, **kw):
        from .logprobs import _token_logprobs_unsharded

        return _token_logprobs_unsharded(self, input_ids, attention_mask, **kw)

    setattr(lm, SCORING_METHOD, types.MethodType(score_tokens, lm))
    register_fsdp_forward_method(lm, SCORING_METHOD)
    return lm


def load_full_state_from_rank0(model: nn.Module, full_state: dict[str, torch.Tensor] | None,
                               device: torch.device) -> None:
    """Give every rank its shards of rank 0's weights (a collective).

    Rank 0 passes the whole state dict it loaded before sharding; the other ranks built ``model``
    on the meta device (``rl_module.empty_weights``) and pass None: their shards are allocated
    (``to_empty``) and filled by ``set_model_state_dict(broadcast_from_rank0=True)``. Buffers that
    are not in the state dict (RoPE ``inv_freq``) are broadcast from rank 0 as well.
    """
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    rank = dist.get_rank()
    if rank != 0:
        model.to_empty(device=device)
    set_model_state_dict(model, full_state if rank == 0 else {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    comm_device = device if dist.get_backend() == "nccl" else torch.device("cpu")
    for buf in model.buffers():
        staged = buf.to(comm_device)
        dist.broadcast(staged, src=0)
        if staged is not buf:
            buf.copy_(staged)


def is_sharded(model: nn.Module) -> bool:
    """Whether any parameter of ``model`` is a DTensor shard."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor: all-gathers a DTensor (a collective: every rank must call it), returns a
    plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def iter_full_state(state: dict[str, torch.Tensor], *, keep: bool,
                    dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor | None]]:
    """(name, whole tensor on CPU) of a state dict, one tensor at a time.

    Each DTensor is all-gathered, copied to CPU (cast to ``dtype`` when given) and its gathered
    buffer dropped before the next one: a rank never holds more than one extra parameter on its
    device. Ranks with ``keep=False`` take part in the gathers and yield None (only the rank that
    ships the weights keeps the CPU copy).
    """
    for name, t in state.items():
        whole = full_tensor(t.detach())
        if keep:
            out = whole.to("cpu", dtype=dtype or whole.dtype, copy=True)
            yield name, out
        else:
            yield name, None
        del whole


def local_numel(tensors: Iterable[torch.Tensor]) -> int:
    """Elements stored on this rank (a DTensor counts its local shard)."""
    from torch.distributed.tensor import DTensor

    return sum((t.to_local() if isinstance(t, DTensor) else t).numel() for t in tensors if t is not None)


def local_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes stored on this rank (a DTensor counts its local shard)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        if t is None:
            continue
        t = t.to_local() if isinstance(t, DTensor) else t
        total += t.numel() * t.element_size()
    return total


def global_grad_norm(grads: Iterable[torch.Tensor]) -> torch.Tensor:
    """L2 norm of all gradients, over every rank's shards: ||g|| = sqrt(sum_i ||g_i||^2).

    Returns a plain 0-d tensor (the DTensor norm is reduced over the mesh)."""
    gs = [g.detach() for g in grads if g is not None]
    if not gs:
        return torch.zeros(())
    norm = torch.nn.utils.get_total_norm(gs, norm_type=2.0)
    return full_tensor(norm)


def clip_grads_(params: Iterable[torch.Tensor], max_norm: float, total_norm: torch.Tensor) -> None:
    """g <- g * min(1, max_norm / (||g|| + 1e-6)) on every parameter's gradient (DTensors too)."""
    coef = min(1.0, float(max_norm) / (float(total_norm) + 1e-6))
    if coef >= 1.0:
        return
    for p in params:
        if p.grad is not None:
            p.grad.mul_(coef)
