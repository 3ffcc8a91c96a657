"""How the GRPO learner builds and lays out its module: replicated (DDP) or FSDP2-sharded.

:class:`ModuleLayoutMixin` holds the learner's module setup (docs/design.md "Learner sharding"):
rank 0 reads the weights and the other FSDP ranks build empty ones, activation checkpointing,
the frozen reference model of the KL term, FSDP2 sharding before the optimizer is built (so
AdamW holds the float32 master shards and their state), the compute context of mixed
precision, and the collectives and byte counts that depend on the layout. Under "ddp" RLlib
wraps the module in DDP as usual.

CPU offload (docs/design.md "Learner sharding"): an offloading learner on GPUs shards on a mesh
whose group has a CPU backend beside NCCL (``sharding.offload_mesh``; the reasons are in
models/sharding.py), and its torch threads are the CPUs reserved for it (``num_cpus_per_learner``,
models/threads.py), since the AdamW step on its shards runs on the CPU.

The reference model is held in the compute dtype under ``mixed_precision="bf16"``
(``reference_model``): it is never updated, so it needs no float32 master copy. Under FSDP its
log-probs are exactly those of a float32 copy (the policy's bf16 all-gather rounds the same
weights to the same bf16 values); under autocast they differ by bf16 rounding
(tests/models/test_cpu_offload.py). Half the memory either way: a 7B reference is 14 GB, not 28.
"""
from __future__ import annotations

import contextlib
import copy

import torch
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.annotations import override

from ...models import sharding
from ...models.threads import apply_torch_threads, learner_torch_threads

__all__ = ["ModuleLayoutMixin", "rank", "hf_model_of", "reference_model"]


def rank() -> int:
    """This process's rank in the learners' process group (0 without one)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def hf_model_of(module):
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


class ModuleLayoutMixin:
    """Module construction and layout of a TorchLearner (mixed in before TorchLearner).

    Sets ``self._ref_model``: the frozen reference policy when ``kl_coeff > 0``, else None."""

    _ref_model: torch.nn.Module | None = None
    _fsdp_mesh = None  # the mesh both models are sharded on (None: fully_shard's default)
    _fsdp_mesh_ready = False

    @property
    def is_sharded(self) -> bool:
        """FSDP2 layout (learners(sharding="fsdp"))."""
        return getattr(self.config, "sharding", "ddp") == "fsdp"

    @override(TorchLearner)
    def _make_module(self):
        config = self.config
        device = self.device
        self._apply_learner_threads()
        if self.is_sharded and device is not None and device.type == "cuda":
            torch.cuda.set_device(device)  # FSDP's default mesh uses the current device
        if self.is_sharded and rank() != 0:
            from ...models.rl_module import empty_weights

            with empty_weights():  # rank 0 reads the weights; the others get their shards from it
                module = super()._make_module()
        else:
            module = super()._make_module()
        for mid in module.keys():
            rlm = module[mid]
            hf = hf_model_of(rlm)
            self._apply_activation_checkpointing(rlm, hf)
            if float(getattr(config, "kl_coeff", 0.0) or 0.0) > 0 and self._ref_model is None:
                # KL to a frozen reference (SPADER option): a copy of the initial policy,
                # learner-only, taken before sharding (and sharded like the policy).
                from ...models.logprobs import unwrap_causal_lm

                self._ref_model = reference_model(unwrap_causal_lm(hf), getattr(config, "mixed_precision", None))
                if self.is_sharded:
                    self._shard_from_rank0(self._ref_model)
            if self.is_sharded:
                import torch.distributed as dist

                if not dist.is_initialized():
                    raise RuntimeError("sharding='fsdp' needs the learners' process group: use "
                                       ".learners(num_learners=N) with N >= 1 (remote learners)")
                self._shard_from_rank0(hf)
                rlm.compute_device = device
        return module

    @override(TorchLearner)
    def _map_module_to_device(self, module) -> None:
        # FSDP moves each rank's shards to the mesh's device as it shards (and keeps them in CPU
        # memory under cpu_offload): moving the whole model to the GPU first would need a full
        # replica's memory on every rank, which is what sharding is for.
        if not self.is_sharded:
            super()._map_module_to_device(module)

    @override(TorchLearner)
    def _make_modules_ddp_if_necessary(self) -> None:
        if not self.is_sharded:  # FSDP shards instead of replicating
            super()._make_modules_ddp_if_necessary()

    def _apply_learner_threads(self) -> int:
        """torch's intra-op threads: ``torch_num_threads``, else the CPUs Ray reserves for a
        remote learner (``num_cpus_per_learner``; models/threads.py). Returns the count."""
        config = self.config
        return apply_torch_threads(learner_torch_threads(
            getattr(config, "torch_num_threads", None), getattr(config, "num_cpus_per_learner", "auto"),
            int(getattr(config, "num_learners", 0) or 0)))

    def _sharding_mesh(self):
        """The mesh of both sharded models, made once (a collective: every rank gets here in
        the same order): ``sharding.offload_mesh`` under cpu_offload, else None (the default
        mesh)."""
        if not self._fsdp_mesh_ready:
            device = self.device
            self._fsdp_mesh = sharding.offload_mesh("cpu" if device is None else device.type,
                                                    cpu_offload=bool(self.config.cpu_offload))
            self._fsdp_mesh_ready = True
        return self._fsdp_mesh

    def _shard_from_rank0(self, model) -> None:
        """FSDP2-shard ``model`` and fill every rank's shards from rank 0's loaded weights."""
        full = dict(model.state_dict()) if rank() == 0 else None  # CPU tensors, no copy
        sharding.shard_causal_lm(model, mixed_precision=self.config.mixed_precision,
                                 cpu_offload=bool(self.config.cpu_offload), mesh=self._sharding_mesh())
        sharding.load_full_state_from_rank0(model, full, self.device)

    def _apply_activation_checkpointing(self, rlm, hf) -> None:
        """learners(activation_checkpointing=True/False) overrides model_config's switch."""
        want = getattr(self.config, "activation_checkpointing", None)
        if want is None or not hasattr(hf, "gradient_checkpointing_enable"):
            return
        from ...models.logprobs import unwrap_causal_lm

        lm = unwrap_causal_lm(hf)
        if want:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            lm.config.use_cache = False
            if hf is not lm and hasattr(hf, "enable_input_require_grads"):
                hf.enable_input_require_grads()  # LoRA: frozen embeddings, checkpointed blocks
        elif getattr(lm, "is_gradient_checkpointing", False):
            lm.gradient_checkpointing_disable()

    def _compute_context(self):
        """bf16 autocast for mixed precision on a replicated (DDP / single) learner; FSDP casts
        the gathered parameters itself (MixedPrecisionPolicy)."""
        if getattr(self.config, "mixed_precision", None) == "bf16" and not self.is_sharded:
            device = self.device
            return torch.autocast(device_type=device.type if device is not None else "cpu",
                                  dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _max_over_ranks(self, n: int) -> int:
        """max(n) over the learner ranks (FSDP: every rank must run as many forwards)."""
        import torch.distributed as dist

        if not (self.is_sharded and dist.is_initialized()) or dist.get_world_size() == 1:
            return n
        t = torch.tensor([n], dtype=torch.long,
                         device=self.device if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def _optimizers(self) -> list:
        """Every registered optimizer, module by module."""
        return [optim for mid in self.module.keys() for _, optim in self.get_optimizers_for_module(mid)]

    def state_bytes(self) -> dict[str, int]:
        """Bytes this rank stores for parameters, gradients and optimizer state (a DTensor counts
        its local shard; the optimizer's scalar ``step`` counters are included)."""
        params = [p for mid in self.module.keys() for p in self.module[mid].parameters()]
        opt = [t for optim in self._optimizers() for st in optim.state.values()
               for t in st.values() if isinstance(t, torch.Tensor)]
        return {"param_bytes": sharding.local_bytes(params),
                "grad_bytes": sharding.local_bytes(p.grad for p in params),
                "optimizer_bytes": sharding.local_bytes(opt)}
