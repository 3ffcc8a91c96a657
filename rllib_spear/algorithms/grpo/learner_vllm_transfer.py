"""The learner's side of transport "vllm" (docs/design.md "The vLLM transport"): vLLM's trainer
weight-transfer API over the learner's inference weights, cast to the engine's dtype.

Every learner rank takes part (under FSDP each tensor is all-gathered); rank 0 is vLLM's sender:
it holds the trainer engine built by ``WeightTransferTrainerFactory.trainer_init`` with a
:class:`~rllib_spear.weight_streaming.vllm_transfer.RunnerClient` over the env runners, and drives
their engines' start / update / finish while it sends.
"""
from __future__ import annotations

from typing import Any, Iterator, Sequence

import torch

__all__ = ["VLLMTransferMixin"]


class VLLMTransferMixin:
    """Mixed into the GRPO learner (before TorchLearner)."""

    _vllm_transfer: dict | None = None  # {"group_id", "engine", "client"} of the formed group

    def vllm_transfer_group_id(self) -> str | None:
        """The id of the transfer group this learner sends to (None: none formed)."""
        return None if self._vllm_transfer is None else self._vllm_transfer["group_id"]

    def vllm_transfer_init(self, group_id: str, backend: str, runners: Sequence[Any] | None,
                           world_sizes: Sequence[int], bucket_bytes: int, wire_dtype: str | None) -> None:
        """Form a transfer group with the runners' engines (every rank; rank 0 rendezvouses with
        them and blocks until every engine worker joined). ``runners``: Ray actor handles of the
        runners, or the runner objects when they live in this process (the driver's local runner
        with a local learner); ``world_sizes``: each runner's engine worker count; ``wire_dtype``:
        the engines' weight dtype (the sender casts to it). An older group is shut down first."""
        from ...weight_streaming.collective import _node_ip
        from ...weight_streaming.vllm_transfer import (RunnerClient, WeightTransferTrainerFactory,
                                                       trainer_init_info)
        from .learner_state import rank

        self.vllm_transfer_shutdown()
        r = rank()
        client = RunnerClient(runners or [], world_sizes) if r == 0 else _NoClient()
        client.group_id = group_id
        world_size = 1 + sum(int(w) for w in world_sizes)
        info = trainer_init_info(backend, rank=r, world_size=world_size, group_id=group_id,
                                 bucket_bytes=int(bucket_bytes), host=_node_ip() if r == 0 else None)
        dtype = getattr(torch, wire_dtype) if wire_dtype else None
        engine = WeightTransferTrainerFactory.trainer_init(info, client=client, source=_LearnerSource(self, dtype))
        self._vllm_transfer = {"group_id": group_id, "engine": engine, "client": client}

    def vllm_transfer_send(self) -> int | None:
        """One sync through the formed group (every rank); rank 0 returns the version it sent."""
        from .learner_state import rank

        state = self._vllm_transfer
        if state is None:
            raise RuntimeError("vllm_transfer_send: no transfer group; call vllm_transfer_init first")
        version = self.weights_version()
        state["client"].pending_version = version
        try:
            state["engine"].send_weights()
        except BaseException:
            self._vllm_transfer = None  # a broken group is re-formed by the next sync
            raise
        return version if rank() == 0 else None

    def vllm_transfer_sent_bytes(self) -> int | None:
        """Bytes the last sync put on the wire (gloo backend; None for vLLM's backends)."""
        state = self._vllm_transfer
        return None if state is None else getattr(state["engine"], "sent_bytes", None)

    def vllm_transfer_shutdown(self) -> None:
        state, self._vllm_transfer = self._vllm_transfer, None
        if state is not None:
            try:
                state["engine"].shutdown()
            except Exception:  # pragma: no cover - a broken group is dropped either way
                pass


class _NoClient:
    """The client of a non-sender rank: vLLM's trainer engines never call it there."""

    group_id: str | None = None
    pending_version: int | None = None

    def __getattr__(self, name: str):
        raise RuntimeError(f"weight transfer: learner ranks other than 0 do not call the engines ({name})")


def _import_source_base():
    from ...weight_streaming.vllm_transfer import EngineWeightSource

    return EngineWeightSource


class _LearnerSource:
    """vLLM ``WeightSource`` over a learner's inference weights (built lazily: the base class
    lives in a module that imports vLLM)."""

    def __new__(cls, learner, wire_dtype: torch.dtype | None):
        base = _import_source_base()

        class LearnerWeightSource(base):
            """The default module's inference weights (tied ``lm_head`` left out, LoRA merged),
            whole tensors on the learner's device, cast to the engine's dtype on the sender."""

            def __init__(self) -> None:
                self._learner = learner
                self._merged: dict | None = None
                super().__init__([], self._iterate, wire_dtype)

            def metadata(self):
                from vllm.distributed.weight_transfer.base import ParamMeta

                rlm, model = learner._engine_model()
                if model is not rlm.model:  # LoRA: the merged weights, computed whole (a collective)
                    self._merged = rlm.get_state(inference_only=True)
                    named = self._merged
                else:
                    from .learner_state import _engine_state_dict

                    named = _engine_state_dict(model)
                return [ParamMeta(k, self._wire(v.dtype, wire_dtype), tuple(v.shape)) for k, v in named.items()]

            def _iterate(self) -> Iterator[tuple[str, torch.Tensor | None]]:
                from ...models.sharding import iter_full_state
                from .learner_state import _engine_state_dict, rank

                keep = rank() == 0
                if self._merged is not None:
                    merged, self._merged = self._merged, None
                    if keep:
                        yield from ((k, v.detach()) for k, v in merged.items())
                    return
                sd = _engine_state_dict(learner._engine_model()[1])
                if not learner.is_sharded:
                    if keep:
                        yield from ((k, v.detach()) for k, v in sd.items())
                    return
                # gathered where they live: NCCL / CUDA IPC send device tensors as they are
                yield from iter_full_state(sd, keep=keep, device=None)

        return LearnerWeightSource()
