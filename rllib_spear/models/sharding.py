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

CPU offload on GPUs (docs/design.md "Learner sharding"): FSDP2 copies an offloaded shard to the
GPU for its own all-gathers, but every other collective on a shard runs on a CPU tensor: gathering
the weights for the engines (``full_tensor``), the global gradient norm (a CPU partial norm), and
whatever torch runs on a CPU ``DTensor``. Ray Train starts GPU learners on an NCCL-only group
("cuda:nccl"), which has no backend for CPU tensors ("No backend type associated with device type
cpu"). Two measures, both: the FSDP mesh of an offloading learner gets its own group over the same
ranks with a CPU backend beside the default group's (``offload_group_backend``: "cpu:gloo,
cuda:nccl", what torchtitan starts when it offloads; ``offload_mesh``), so that no collective on a
CPU shard can fail; and ``full_tensor`` moves a shard to its mesh's device before gathering (what
verl does), so that the weights and the norm travel over NCCL rather than gloo over TCP (tens of
GB per sync for a 32B model). Why a group of our own rather than the default one: RLlib's
LearnerGroup builds Ray Train's ``TorchConfig`` itself, with no backend option, and torch cannot
add a backend to an existing group through a public API; a group made with ``dist.new_group``
(public) and a mesh made with ``DeviceMesh.from_group`` (public) cost one more NCCL communicator.

Scoring: ``rllib_spear.models.logprobs.token_logprobs`` runs the decoder body and the output head
separately (the head in checkpointed chunks), never the LM's own ``forward``. The root group's
parameters are all-gathered by FSDP's pre-forward hook, so the sharded LM gets a ``score_tokens``
method registered with ``register_fsdp_forward_method``: one root "forward" around the body and
every head chunk. ``token_logprobs`` dispatches to it when it is present.

No Ray here: the learner (learner/module_layout.py, learner/steps.py) calls these on its process group.
"""
from __future__ import annotations

import types
from typing import TYPE_CHECKING, Iterable, Iterator

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "SCORING_METHOD", "shard_causal_lm", "load_full_state_from_rank0", "is_sharded", "transformer_blocks", "full_tensor",
    "iter_full_state", "local_numel", "local_bytes", "global_grad_norm", "clip_grads_",
    "offload_group_backend", "offload_mesh",
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
    plain tensor as it is. A CPU-offloaded shard of a GPU mesh is first copied to the GPU (the
    module docstring: the gather runs over NCCL) and the whole tensor is returned there."""
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return t
    if _offloaded(t):  # never on CPU meshes
        # non_blocking: the gather is queued behind the copy on the current stream
        t = _rewrap(t, t.to_local().to(t.device_mesh.device_type, non_blocking=True))
    return t.full_tensor()


def _rewrap(t, local: torch.Tensor):
    """``t`` with its local tensor replaced by ``local`` (same mesh, placements, global shape
    and stride: FSDP's shards can be uneven, which ``from_local`` cannot infer)."""
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(local, t.device_mesh, t.placements, run_check=False,
                              shape=t.shape, stride=t.stride())


def offload_group_backend(default_backend: str, cpu_offload: bool) -> str | None:
    """The backend string of the FSDP group of an offloading learner, or None when the default
    group serves (no offload, or its backend already handles CPU tensors).

    ``default_backend`` is the default group's backend as ``dist.get_backend_config()`` writes it
    ("cuda:nccl", "cpu:gloo,cuda:gloo") or as it was passed to ``init_process_group`` ("nccl",
    "gloo"). Offloading adds "cpu:gloo" to the default group's devices: Ray's "nccl" for GPU
    learners -> "cpu:gloo,cuda:nccl"; "gloo" (CPU learners) -> None.
    """
    if not cpu_offload:
        return None
    import torch.distributed as dist

    devices: dict[str, str] = {}
    for item in (x.strip() for x in str(default_backend).split(",")):
        if not item:
            continue
        if ":" in item:
            device, name = item.split(":", 1)
            devices[device.strip().lower()] = name.strip().lower()
        else:  # a bare name serves every device type it supports
            for device in dist.Backend.backend_capability.get(item.lower(), []):
                devices.setdefault(device, item.lower())
    if "cpu" in devices:
        return None
    devices["cpu"] = "gloo"
    return ",".join(f"{d}:{devices[d]}" for d in sorted(devices))


def offload_mesh(device_type: str, *, cpu_offload: bool) -> "DeviceMesh | None":
    """The 1-D ``DeviceMesh`` to shard on (``shard_causal_lm(mesh=...)``), over a group of every
    rank with the backend ``offload_group_backend`` asks for; None when the default mesh serves
    (no offload, no process group, or a default group with a CPU backend). A collective: every
    rank must call it, in the same order as its other group creations."""
    import torch.distributed as dist

    if not cpu_offload or not dist.is_initialized():
        return None
    backend = offload_group_backend(dist.get_backend_config(), cpu_offload)
    if backend is None:
        return None
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(dist.new_group(backend=backend), device_type)


def iter_full_state(state: dict[str, torch.Tensor], *, keep: bool,
                    dtype: torch.dtype | None = None,
                    device: str | torch.device | None = "cpu") -> Iterator[tuple[str, torch.Tensor | None]]:
    """(name, whole tensor on CPU) of a state dict, one tensor at a time.

    Each DTensor is all-gathered, copied to CPU (cast to ``dtype`` when given) and its gathered
    buffer dropped before the next one: a rank never holds more than one extra parameter on its
    device. Ranks with ``keep=False`` take part in the gathers and yield None (only the rank that
    ships the weights keeps the CPU copy). ``device=None`` keeps each tensor where it was
    gathered (the vLLM transport sends GPU tensors over NCCL or CUDA IPC as they are); a cast
    there copies only when ``dtype`` differs.
    """
    for name, t in state.items():
        whole = full_tensor(t.detach())
        if keep:
            if device is None:
                out = whole.to(dtype=dtype or whole.dtype)
            else:
                out = whole.to(device, dtype=dtype or whole.dtype, copy=True)
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

    Returns a plain 0-d tensor (the DTensor norm is reduced over the mesh). CPU-offloaded shards
    of a GPU mesh: ``_norm_of_shards`` (torch's norm of DTensors would reduce the CPU partial norms
    on the CPU, i.e. over gloo)."""
    gs = [g.detach() for g in grads if g is not None]
    if not gs:
        return torch.zeros(())
    if any(_offloaded(g) for g in gs):
        return _norm_of_shards(gs)
    norm = torch.nn.utils.get_total_norm(gs, norm_type=2.0)
    return full_tensor(norm)


def _offloaded(t: torch.Tensor) -> bool:
    """A DTensor whose local shard is not on its mesh's device (FSDP2 ``CPUOffloadPolicy`` on a
    GPU mesh)."""
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor) and t.to_local().device.type != t.device_mesh.device_type


def _norm_of_shards(gs: list[torch.Tensor]) -> torch.Tensor:
    """The global L2 norm with the local work on the shards where they are (the CPU, torch's
    foreach kernel) and one all-reduce of this rank's squared norm on the mesh's device: a
    ``Partial("sum")`` over the dimensions the shards are split on. Plain tensors are whole on
    every rank and are added once."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    shards = [g for g in gs if isinstance(g, DTensor)]
    plain = [g for g in gs if not isinstance(g, DTensor)]
    mesh = shards[0].device_mesh
    local = torch.nn.utils.get_total_norm([g.to_local() for g in shards], norm_type=2.0)
    squared = local.float().pow(2).reshape(()).to(mesh.device_type, non_blocking=True)
    placements = [Partial("sum") if isinstance(p, Shard) else Replicate() for p in shards[0].placements]
    total = DTensor.from_local(squared, mesh, placements, run_check=False).full_tensor()
    if plain:
        total = total + torch.nn.utils.get_total_norm(plain, norm_type=2.0).float().to(total.device).pow(2)
    return total.sqrt()


def clip_grads_(params: Iterable[torch.Tensor], max_norm: float, total_norm: torch.Tensor) -> None:
    """g <- g * min(1, max_norm / (||g|| + 1e-6)) on every parameter's gradient (DTensors too)."""
    coef = min(1.0, float(max_norm) / (float(total_norm) + 1e-6))
    if coef >= 1.0:
        return
    for p in params:
        if p.grad is not None:
            p.grad.mul_(coef)
