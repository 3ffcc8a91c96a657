"""The learner's side of the weight sync (docs/design.md "Weight streaming"): its inference
weights as the engines load them (:class:`LearnerWeights`) and the senders it holds, one per
transport it has sent through (:class:`WeightSenders`, ``learner.weight_senders``).

The engines load the default module's HF state dict: a tied ``lm_head.weight`` is left out, a
LoRA module's weights are merged, FSDP shards are gathered one tensor at a time, and each
floating tensor wider than the engines' dtype travels in that dtype (:func:`wire_dtype_of`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

import torch

if TYPE_CHECKING:
    from .transport import Transport, WeightSender

__all__ = ["LearnerWeights", "WeightSenders", "wire_dtype_of", "engine_state_dict"]


def wire_dtype_of(tensor_dtype: torch.dtype, engine_dtype: torch.dtype | None) -> torch.dtype:
    """The dtype a tensor travels in to the engines: the engines' dtype for a floating tensor
    that is wider (fp32 master weights to bf16 engines: half the bytes, the same values the
    engine's own cast would give), else its own (integers, or an engine at least as wide: a
    widening cast would only add bytes)."""
    if (engine_dtype is not None and tensor_dtype.is_floating_point and engine_dtype.is_floating_point
            and engine_dtype.itemsize < tensor_dtype.itemsize):
        return engine_dtype
    return tensor_dtype


def _to_wire(t: torch.Tensor, engine_dtype: torch.dtype | None) -> torch.Tensor:
    dtype = wire_dtype_of(t.dtype, engine_dtype)
    return t if dtype == t.dtype else t.to(dtype)


def engine_state_dict(model: Any, keep_vars: bool = False) -> dict:
    """The HF model's state dict as the engines load it: a tied ``lm_head.weight`` left out."""
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    return {k: v for k, v in model.state_dict(keep_vars=keep_vars).items()
            if not (tied and k.endswith("lm_head.weight"))}


class LearnerWeights:
    """One learner rank's inference weights (``learner``: an RLlib Learner holding an
    ``HFCausalLMRLModule``), what every sender reads."""

    def __init__(self, learner: Any) -> None:
        self.learner = learner

    @staticmethod
    def rank() -> int:
        """This process's rank among the learners (0 without a process group): rank 0 sends."""
        import torch.distributed as dist

        return dist.get_rank() if dist.is_initialized() else 0

    @property
    def is_sharded(self) -> bool:
        return bool(self.learner.is_sharded)

    def version(self) -> int:
        """The learner's weights version (WEIGHTS_SEQ_NO)."""
        from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

        return int(self.learner.get_state(components=[])[WEIGHTS_SEQ_NO])

    def model(self) -> tuple[Any, Any]:
        """(the default module's RLModule, its HF model)."""
        from ray.rllib.core import DEFAULT_MODULE_ID

        module = self.learner.module
        mids = list(module.keys())
        rlm = module[DEFAULT_MODULE_ID if DEFAULT_MODULE_ID in mids else mids[0]].unwrapped()
        return rlm, rlm.hf_model()

    def merged(self) -> bool:
        """Whether the engines get merged weights (LoRA: computed whole, per sync)."""
        rlm, model = self.model()
        return model is not rlm.model

    def state(self) -> dict | None:
        """The inference weights with their version, through RLlib's state (every rank must call
        this under FSDP: the shards are gathered one tensor at a time); rank 0 returns
        ``{"rl_module": {module_id: HF state dict}, WEIGHTS_SEQ_NO: n}``, the others None."""
        from ray.rllib.core import COMPONENT_RL_MODULE
        from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

        learner = self.learner
        if not self.is_sharded:
            state = learner.get_state(components=COMPONENT_RL_MODULE, inference_only=True)
            return {COMPONENT_RL_MODULE: state[COMPONENT_RL_MODULE], WEIGHTS_SEQ_NO: state[WEIGHTS_SEQ_NO]}
        out = {mid: learner.module[mid].unwrapped().get_state(inference_only=True) for mid in learner.module.keys()}
        if self.rank() != 0:
            return None
        return {COMPONENT_RL_MODULE: out, WEIGHTS_SEQ_NO: learner.get_state(components=[])[WEIGHTS_SEQ_NO]}

    def iter(self, placeholders: bool = False, engine_dtype: str | torch.dtype | None = None
             ) -> Iterator[tuple[str, torch.Tensor | None]]:
        """(HF name, whole tensor) of the inference weights, one tensor at a time, on the
        learner's device (the senders copy them to the host a bucket at a time,
        ``staging.HostStaging``). Under FSDP every rank must drain it (each tensor is
        all-gathered, ``models.sharding.iter_full_state``, and left where it was gathered) and
        only rank 0 gets tensors (the others get None, or with ``placeholders`` an empty "meta"
        tensor of the same shape and wire dtype, so that they can cut the same buckets);
        unsharded, rank 0 yields the tensors as they are (no copy) and the other ranks nothing.
        ``engine_dtype`` ("bfloat16" or a torch dtype): each floating tensor wider than it is
        cast to it on the way (:func:`wire_dtype_of`; one tensor at a time, on the learner's
        device). A LoRA module yields its merged weights (computed whole first: the merge
        needs them)."""
        from ..models.dtypes import torch_dtype
        from ..models.sharding import iter_full_state

        engine_dtype = None if engine_dtype is None else torch_dtype(engine_dtype)
        keep = self.rank() == 0
        rlm, model = self.model()
        if model is not rlm.model:  # LoRA: the merged state (a collective under FSDP)
            merged = rlm.get_state(inference_only=True)
            yield from ((k, _to_wire(v, engine_dtype) if keep or placeholders else None) for k, v in merged.items())
            return
        sd = engine_state_dict(model)
        if not self.is_sharded:
            if keep:
                yield from ((k, _to_wire(v.detach(), engine_dtype)) for k, v in sd.items())
            return
        for k, v in sd.items():
            wire = wire_dtype_of(v.dtype, engine_dtype)
            # kept where it was gathered: the sender copies a whole bucket to the host at once
            # (staging.HostStaging), not one tensor at a time into pageable memory
            (_, t), = iter_full_state({k: v}, keep=keep, dtype=None if wire == v.dtype else wire, device=None)
            yield k, (torch.empty(v.shape, dtype=wire, device="meta") if t is None and placeholders else t)


class WeightSenders:
    """The senders a learner holds, one per transport, built on first use from its
    :class:`LearnerWeights` (``weights``)."""

    def __init__(self, learner: Any) -> None:
        self.weights = LearnerWeights(learner)
        self._senders: dict[str, "WeightSender"] = {}

    def of(self, transport: str | type["Transport"]) -> "WeightSender":
        """The sender of ``transport`` (its class, or its registered name)."""
        from .registry import transport_class  # (the registry imports the built-ins, which import this module)

        cls = transport_class(transport)
        sender = self._senders.get(cls.name)
        if sender is None:
            sender = self._senders[cls.name] = cls.sender(self.weights)
        return sender
