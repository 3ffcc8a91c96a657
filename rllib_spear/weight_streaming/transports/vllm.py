"""Transport "vllm": vLLM's own weight-transfer API (docs/design.md "The vLLM transport"; the
backends, the weight source and the runner client: ``weight_streaming/vllm_transfer.py``, which
imports vLLM and is imported on use).

The driver forms a transfer group of the learners and every runner's engine (again when the
runners changed: a restarted runner is in none); then each sync is one call on the learners.
Every learner rank iterates the weights (under FSDP each tensor is all-gathered); rank 0 is
vLLM's sender: it holds the trainer engine built by ``WeightTransferTrainerFactory.trainer_init``
with a ``RunnerClient`` over the runners' receivers, and drives their engines' start / update /
finish while it sends, in the engines' dtype. The default transport of vLLM engines, so it is
lenient: where the learner cannot reach the runners, or a sync fails, the object store carries
the sync.
"""
from __future__ import annotations

import logging
import uuid
from typing import Any, Iterator, Mapping, Sequence

import torch

from ..learner_side import engine_state_dict
from ..registry import register_transport
from ..transport import Placement, Transport, WeightReceiver, WeightSender

__all__ = ["VLLMTransport", "VLLMSender", "VLLMReceiver"]

logger = logging.getLogger(__name__)


class VLLMSender(WeightSender):
    """vLLM's trainer side over this learner's inference weights (every rank; rank 0 sends)."""

    _transfer: dict | None = None  # {"group_id", "engine", "client"} of the formed group

    def group_id(self) -> str | None:
        """The id of the transfer group this learner sends to (None: none formed)."""
        return None if self._transfer is None else self._transfer["group_id"]

    def init_group(self, group_id: str, backend: str, runners: Sequence[Any] | None, world_sizes: Sequence[int],
                   bucket_bytes: int, wire_dtype: str | None) -> None:
        """Form a transfer group with the runners' engines (every rank; rank 0 rendezvouses with
        them and blocks until every engine worker joined). ``runners``: how to reach each runner
        (Ray actor handles, or the receivers themselves when they live in this process: the
        driver's local runner with a local learner); ``world_sizes``: each runner's engine worker
        count; ``wire_dtype``: the engines' weight dtype (the sender casts to it). An older group
        is shut down first."""
        from ..collective import _node_ip
        from ..vllm_transfer import RunnerClient, WeightTransferTrainerFactory, trainer_init_info

        self.shutdown()
        rank = self.weights.rank()
        client = RunnerClient(runners or [], world_sizes) if rank == 0 else _NoClient()
        client.group_id = group_id
        world_size = 1 + sum(int(w) for w in world_sizes)
        info = trainer_init_info(backend, rank=rank, world_size=world_size, group_id=group_id,
                                 bucket_bytes=int(bucket_bytes), host=_node_ip() if rank == 0 else None)
        dtype = getattr(torch, wire_dtype) if wire_dtype else None
        engine = WeightTransferTrainerFactory.trainer_init(info, client=client, source=_learner_source(self.weights, dtype))
        self._transfer = {"group_id": group_id, "engine": engine, "client": client}

    def send(self) -> int | None:
        """One sync through the formed group (every rank); rank 0 returns the version it sent."""
        state = self._transfer
        if state is None:
            raise RuntimeError("VLLMSender.send: no transfer group; call init_group first")
        version = self.weights.version()
        state["client"].pending_version = version
        try:
            state["engine"].send_weights()
        except BaseException:
            self._transfer = None  # a broken group is re-formed by the next sync
            raise
        return version if self.weights.rank() == 0 else None

    def sent_bytes(self) -> int | None:
        """Bytes the last sync put on the wire (gloo backend; None for vLLM's backends)."""
        state = self._transfer
        return None if state is None else getattr(state["engine"], "sent_bytes", None)

    def shutdown(self) -> None:
        state, self._transfer = self._transfer, None
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


def _learner_source(weights, wire_dtype: torch.dtype | None):
    """vLLM ``WeightSource`` over a learner's inference weights (the class is made here: its
    base lives in a module that imports vLLM)."""
    from ..vllm_transfer import EngineWeightSource

    class LearnerWeightSource(EngineWeightSource):
        """The default module's inference weights (tied ``lm_head`` left out, LoRA merged),
        whole tensors on the learner's device, cast to the engine's dtype on the sender."""

        def __init__(self) -> None:
            self._merged: dict | None = None
            super().__init__([], self._iterate, wire_dtype)

        def metadata(self):
            from vllm.distributed.weight_transfer.base import ParamMeta

            rlm, model = weights.model()
            if model is not rlm.model:  # LoRA: the merged weights, computed whole (a collective)
                self._merged = rlm.get_state(inference_only=True)
                named = self._merged
            else:
                named = engine_state_dict(model)
            return [ParamMeta(k, self._wire(v.dtype, wire_dtype), tuple(v.shape)) for k, v in named.items()]

        def _iterate(self) -> Iterator[tuple[str, torch.Tensor | None]]:
            from ...models.sharding import iter_full_state

            keep = weights.rank() == 0
            if self._merged is not None:
                merged, self._merged = self._merged, None
                if keep:
                    yield from ((k, v.detach()) for k, v in merged.items())
                return
            sd = engine_state_dict(weights.model()[1])
            if not weights.is_sharded:
                if keep:
                    yield from ((k, v.detach()) for k, v in sd.items())
                return
            # gathered where they live: NCCL / CUDA IPC send device tensors as they are
            yield from iter_full_state(sd, keep=keep, device=None)

    return LearnerWeightSource()


class VLLMReceiver(WeightReceiver):
    """The engine's side of vLLM's weight-transfer control plane: learner rank 0's
    ``RunnerClient`` calls these (through ``LLMEnvRunner.weight_receiver_call`` on a remote
    runner); the tensors travel on the backend's own channel. The method names are the engine's
    (``VLLMEngine``): the client drives an engine or a receiver alike."""

    _group_id: str | None = None  # the transfer group this engine is in

    def endpoint(self) -> dict:
        """What the learner needs to form a group with this runner's engine: how to reach it
        (the runner's Ray actor handle; this receiver when it is the driver's local runner), the
        engine's worker count (its ranks in the group) and its weight dtype."""
        weights = self.weights
        target = weights.actor()
        return {"target": self if target is None else target, "world_size": int(weights.engine.world_size),
                "dtype": weights.dtype()}

    def group_id(self) -> str | None:
        """The transfer group this engine is in (None after a restart or a failed update)."""
        return self._group_id

    def init_weight_transfer(self, init_info: Mapping[str, Any], group_id: str | None = None) -> None:
        """Join the learner's transfer group (blocks until every member joined); an older group
        is left first."""
        weights = self.weights
        weights.settle()
        if self._group_id is not None:
            try:
                weights.engine.shutdown_weight_transfer()
            except Exception:  # the old group may be broken already
                pass
        self._group_id = None
        weights.engine.init_weight_transfer(init_info)
        self._group_id = group_id

    def start_weight_update(self) -> None:
        """Open an update (the gate stays open until ``finish_weight_update`` or a failure)."""
        weights = self.weights
        weights.settle()
        weights.begin_update()
        try:
            weights.engine.start_weight_update()
        except BaseException:
            weights.end_update()
            raise

    def receive_weight_update(self, update_info: Mapping[str, Any]) -> None:
        """Every engine worker receives the tensors ``update_info`` lists; a failure leaves the
        group (the next sync forms a new one) and the version as it was."""
        try:
            self.weights.engine.receive_weight_update(update_info)
        except BaseException:
            self._group_id = None
            self.weights.end_update()
            raise

    def finish_weight_update(self, version: int) -> int:
        """Close the update (vLLM finalizes its layerwise reload; the prefix cache is reset) and
        take ``version``: only an update that got here changes the runner's version."""
        weights = self.weights
        try:
            weights.engine.finish_weight_update(int(version))
        finally:
            weights.end_update()
        weights.version = int(version)
        return weights.version

    def shutdown_weight_transfer(self) -> None:
        self._group_id = None
        self.weights.end_update()
        self.weights.engine.shutdown_weight_transfer()


@register_transport("vllm")
class VLLMTransport(Transport):
    """vLLM's weight-transfer API with ``settings.transfer_backend``."""

    sender = VLLMSender
    receiver = VLLMReceiver
    fallback = "object_store"
    strict = False
    requires_engine = "vllm"

    def __init__(self, settings) -> None:
        super().__init__(settings)
        self._group: dict | None = None  # {"group_id", "size"} of the formed transfer group

    @property
    def ready(self) -> bool:
        return self._group is not None

    def unavailable(self, placement: Placement) -> str:
        """The driver's local runner has no actor handle, so it is reachable only from a learner
        in the driver's process."""
        if placement.local_runner_only and not placement.learner_group.is_local:
            return "the runner is the driver's local one and the learners are remote actors"
        if not placement.local_runner_only and placement.healthy_remote_runners() == 0:
            return "no healthy remote runner"
        return ""

    def sync(self, placement: Placement) -> tuple[list[int], int]:
        """A runner whose update did not finish keeps its old version: this sync then goes
        through the fallback too."""
        from ..sync import check_versions

        cls = type(self)
        ids = placement.on_receivers(cls, lambda r: r.group_id())
        group = self._group
        if group is None or ids != [group["group_id"]] * len(ids) or len(ids) != group["size"]:
            self._group = None
            group = self._group = self._form(placement)
        try:
            sent = placement.on_senders(cls, lambda s: s.send())
        except Exception:
            self._group = None  # re-form on the next sync
            raise
        versions = placement.on_receivers(cls, lambda r: r.weights.version)
        return versions, check_versions(versions, int(sent))

    def _form(self, placement: Placement) -> dict:
        """A new transfer group of the learners (rank 0 sends) and every healthy runner's engine:
        each runner says how to reach it, its engine's worker count and weight dtype; every
        learner rank builds vLLM's trainer engine (rank 0 rendezvouses with the engines)."""
        cls = type(self)
        endpoints = placement.on_receivers(cls, lambda r: r.endpoint())
        if not endpoints:
            raise RuntimeError("weight sync: no healthy runner answered")
        dtypes = {e["dtype"] for e in endpoints}
        if len(dtypes) != 1:
            raise RuntimeError(f"weight sync: the runners' engines hold different dtypes {sorted(dtypes)}")
        group_id = f"transfer-{uuid.uuid4().hex[:12]}"
        targets = [e["target"] for e in endpoints]
        sizes = [e["world_size"] for e in endpoints]
        wire = dtypes.pop()
        backend, bucket_bytes = self.settings.transfer_backend, self.settings.bucket_bytes
        placement.on_every_sender(cls, lambda s, g=group_id, t=targets, w=sizes: s.init_group(
            g, backend, t, w, bucket_bytes, wire))
        logger.info("vLLM transfer group %s (%s) formed: learner rank 0 and %d runners (%d engine workers), %s on the "
                    "wire", group_id, backend, len(targets), sum(sizes), wire)
        return {"group_id": group_id, "size": len(targets)}
