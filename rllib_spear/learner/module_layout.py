"""How the learner builds and lays out its module: replicated (DDP) or FSDP2-sharded.

:class:`ModuleLayout` is what the RLlib learner holds for its module setup (docs/design.md
"Learner sharding"): rank 0 reads the weights and the other FSDP ranks build empty ones,
activation checkpointing, the frozen reference model of the KL term, FSDP2 sharding before the
optimizer is built (so AdamW holds the float32 master shards and their state), the compute
context of mixed precision, and the reference log-probs of a micro-batch. Under "ddp" RLlib
wraps the module in DDP as usual.

CPU offload (docs/design.md "Learner sharding"): an offloading learner on GPUs shards on a mesh
whose group has a CPU backend beside NCCL (``sharding.offload_mesh``; the reasons are in
models/sharding.py), and its torch threads are the CPUs reserved for it (``num_cpus_per_learner``,
models/threads.py), since the AdamW step on its shards runs on the CPU.

The reference model is held in the compute dtype under ``mixed_precision="bf16"``
(:func:`reference_model`): it is never updated, so it needs no float32 master copy. Under FSDP
its log-probs are exactly those of a float32 copy (the policy's bf16 all-gather rounds the same
weights to the same bf16 values); under autocast they differ by bf16 rounding
(tests/models/test_cpu_offload.py). Half the memory either way: a 7B reference is 14 GB, not 28.

No Ray here: the RLlib module comes from the caller (``make``).
"""
from __future__ import annotations

import contextlib
import copy
import functools
import logging
from typing import Any, Callable, ContextManager, Mapping

import torch

from ..models import sharding
from ..models.threads import apply_torch_threads, learner_torch_threads
from .ranks import rank

__all__ = ["ModuleLayout", "hf_model_of", "reference_model", "REFERENCE_DTYPES"]


def hf_model_of(module: Any) -> torch.nn.Module:
    """The HF causal LM held by an HFCausalLMRLModule."""
    for name in ("model", "lm", "hf_model"):
        m = getattr(module, name, None)
        if isinstance(m, torch.nn.Module):
            return m
    raise AttributeError(f"{type(module).__name__} holds no HF model under .model/.lm/.hf_model")


#: The dtype a frozen reference model is held in, by ``mixed_precision`` (None: the policy's own).
REFERENCE_DTYPES: dict[str | None, torch.dtype | None] = {None: None, "bf16": torch.bfloat16}


def reference_model(lm: torch.nn.Module, mixed_precision: str | None) -> torch.nn.Module:
    """A frozen copy of the causal LM ``lm`` (eval mode, no gradients) for the KL term, its
    parameters cast to the compute dtype of ``mixed_precision`` (``REFERENCE_DTYPES``). Buffers
    keep their dtype (RoPE's ``inv_freq`` in bf16 would move every position's angle), and the
    cast is in place on each parameter object, so tied embeddings stay one tensor."""
    ref = copy.deepcopy(lm).eval()
    ref.requires_grad_(False)
    dtype = REFERENCE_DTYPES[mixed_precision]
    if dtype is not None:
        for p in ref.parameters():  # parameters() yields a tied tensor once
            p.data = p.data.to(dtype)
    return ref


class ModuleLayout:
    """The module layout of a learner with ``config`` (its ``sharding``, ``mixed_precision``,
    ``cpu_offload``, ``activation_checkpointing``, ``packed_microbatches``, ``kl_coeff``, thread
    knobs) on ``device``.

    ``reference``: the frozen reference policy once :meth:`make_module` ran with
    ``kl_coeff > 0``, else None."""

    def __init__(self, config: Any, device: torch.device | None) -> None:
        self.config = config
        self.device = device
        self.reference: torch.nn.Module | None = None
        self._mesh = None  # the mesh both models are sharded on (None: fully_shard's default)
        self._mesh_ready = False

    @functools.cached_property
    def mixed_precision(self) -> str | None:
        """The precision this learner computes in: ``mixed_precision`` with "auto" resolved for
        its device and master-weight dtype (models/precision.py), once; "auto" logs its choice."""
        from ..models.precision import resolve_mixed_precision

        setting = getattr(self.config, "mixed_precision", None)
        device_type = self.device.type if self.device is not None else "cpu"
        weight_dtype = (getattr(self.config, "model_config", None) or {}).get("dtype", "float32")
        resolved = resolve_mixed_precision(setting, device_type=device_type, weight_dtype=weight_dtype)
        if setting == "auto":
            logging.getLogger(__name__).info(
                "mixed_precision='auto' on %s: %s", device_type,
                "bf16 compute over float32 master weights" if resolved == "bf16"
                else "no bf16 in this device's hardware (or non-float32 weights): compute in the weights' dtype")
        return resolved

    @property
    def sharded(self) -> bool:
        """FSDP2 layout (learners(sharding="fsdp"))."""
        return getattr(self.config, "sharding", "ddp") == "fsdp"

    def make_module(self, make: Callable[[], Any]) -> Any:
        """The learner's MultiRLModule from ``make()`` (RLlib's construction), laid out: threads,
        empty weights on FSDP ranks other than 0, activation checkpointing, packed scoring, the
        reference copy, FSDP sharding."""
        config, device = self.config, self.device
        self.apply_threads()
        if self.sharded and device is not None and device.type == "cuda":
            torch.cuda.set_device(device)  # FSDP's default mesh uses the current device
        if self.sharded and rank() != 0:
            from ..models.rl_module import empty_weights

            with empty_weights():  # rank 0 reads the weights; the others get their shards from it
                module = make()
        else:
            module = make()
        for mid in module.keys():
            rlm = module[mid]
            hf = hf_model_of(rlm)
            self.apply_activation_checkpointing(hf)
            self.apply_packing(rlm, hf)
            if float(getattr(config, "kl_coeff", 0.0) or 0.0) > 0 and self.reference is None:
                # KL to a frozen reference (SPADER option): a copy of the initial policy,
                # learner-only, taken before sharding (and sharded like the policy).
                from ..models.logprobs import unwrap_causal_lm

                self.reference = reference_model(unwrap_causal_lm(hf), self.mixed_precision)
                if self.sharded:
                    self.shard_from_rank0(self.reference)
            if self.sharded:
                import torch.distributed as dist

                if not dist.is_initialized():
                    raise RuntimeError("sharding='fsdp' needs the learners' process group: use "
                                       ".learners(num_learners=N) with N >= 1 (remote learners)")
                self.shard_from_rank0(hf)
                rlm.compute_device = device
        return module

    def apply_threads(self) -> int:
        """torch's intra-op threads: ``torch_num_threads``, else the CPUs Ray reserves for a
        remote learner (``num_cpus_per_learner``; models/threads.py). Returns the count."""
        config = self.config
        return apply_torch_threads(learner_torch_threads(
            getattr(config, "torch_num_threads", None), getattr(config, "num_cpus_per_learner", "auto"),
            int(getattr(config, "num_learners", 0) or 0)))

    def mesh(self):
        """The mesh of both sharded models, made once (a collective: every rank gets here in
        the same order): ``sharding.offload_mesh`` under cpu_offload, else None (the default
        mesh)."""
        if not self._mesh_ready:
            device = self.device
            self._mesh = sharding.offload_mesh("cpu" if device is None else device.type,
                                               cpu_offload=bool(self.config.cpu_offload))
            self._mesh_ready = True
        return self._mesh

    def shard_from_rank0(self, model: torch.nn.Module) -> None:
        """FSDP2-shard ``model`` and fill every rank's shards from rank 0's loaded weights."""
        full = dict(model.state_dict()) if rank() == 0 else None  # CPU tensors, no copy
        sharding.shard_causal_lm(model, mixed_precision=self.mixed_precision,
                                 cpu_offload=bool(self.config.cpu_offload), mesh=self.mesh())
        sharding.load_full_state_from_rank0(model, full, self.device)

    def apply_activation_checkpointing(self, hf: torch.nn.Module) -> None:
        """learners(activation_checkpointing=True/False) overrides model_config's switch."""
        want = getattr(self.config, "activation_checkpointing", None)
        if want is None or not hasattr(hf, "gradient_checkpointing_enable"):
            return
        from ..models.logprobs import unwrap_causal_lm

        lm = unwrap_causal_lm(hf)
        if want:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            lm.config.use_cache = False
            if hf is not lm and hasattr(hf, "enable_input_require_grads"):
                hf.enable_input_require_grads()  # LoRA: frozen embeddings, checkpointed blocks
        elif getattr(lm, "is_gradient_checkpointing", False):
            lm.gradient_checkpointing_disable()

    @property
    def packed(self) -> bool:
        """learners(packed_microbatches=True): score micro-batches as packed rows."""
        return bool(getattr(self.config, "packed_microbatches", False))

    def apply_packing(self, rlm: Any, hf: torch.nn.Module) -> None:
        """Tell the module how to score (``packed_microbatches``); a model that cannot take packed
        rows is refused here, when the learner is built, not at its first update."""
        if self.packed:
            from ..models.packing import check_packable

            check_packable(hf)
        rlm.packed_microbatches = self.packed

    def compute_context(self) -> ContextManager:
        """bf16 autocast for mixed precision on a replicated (DDP / single) learner; FSDP casts
        the gathered parameters itself (MixedPrecisionPolicy)."""
        if self.mixed_precision == "bf16" and not self.sharded:
            device = self.device
            return torch.autocast(device_type=device.type if device is not None else "cpu",
                                  dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def reference_logp(self, temperature: float) -> Callable[[Mapping[str, torch.Tensor]], torch.Tensor] | None:
        """The KL term's reference log-probs of a micro-batch's loss tokens (no grad, in the
        compute context), or None without a reference model (``loss.ReferenceLogp``)."""
        ref = self.reference
        if ref is None:
            return None
        from ..models.logprobs import token_logprobs

        def logp(batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
            with torch.no_grad(), self.compute_context():
                return token_logprobs(ref, batch["input_ids"], batch["attention_mask"],
                                      temperature=float(temperature), score_mask=batch["loss_mask"] > 0,
                                      packed=self.packed).float()

        return logp
