"""Transport "collective": learner rank 0 broadcasts the buckets over a gloo group of itself and
every remote runner, which receive and apply them bucket by bucket (docs/design.md "Weight
streaming"; the group and its wire format: ``weight_streaming/collective.py``).

Rank 0 packs each bucket into its reused host staging buffer (``weight_streaming/staging.py``:
on the device, then one copy to pinned memory) and broadcasts it before packing the next.

The group is formed at the first sync and again whenever its runners changed (a runner restarted
after a failure is in no group). A group that breaks mid-sync hands that sync to the object store;
the next one forms a new group with the healthy runners.
"""
from __future__ import annotations

import logging
import uuid

from ..buckets import iter_buckets
from ..registry import register_transport
from ..staging import HostStaging
from ..transport import Placement, Transport, WeightReceiver, WeightSender

__all__ = ["CollectiveTransport", "CollectiveSender", "CollectiveReceiver"]

logger = logging.getLogger(__name__)


class CollectiveSender(WeightSender):
    """Rank 0 is rank 0 of the weight group; every rank takes part in the FSDP gathers."""

    _group = None  # the formed WeightGroup (rank 0)
    _pending = None  # (group id, world size, store) between open_group and join_group
    _sent_bytes = 0
    _staging: HostStaging | None = None  # the buckets' host buffer (rank 0), kept between syncs

    def open_group(self, group_id: str, world_size: int):
        """Step 1: rank 0 opens a TCP store on its node for a new group of ``world_size``
        members (itself and the runners) and returns (host, port); the other ranks return None.
        An older group is dropped."""
        if self.weights.rank() != 0:
            return None
        from ..collective import open_store

        self._group = None
        store, host, port = open_store(world_size)
        self._pending = (group_id, world_size, store)
        return host, port

    def join_group(self) -> None:
        """Step 2 (rank 0; blocks until every runner joined, see ``CollectiveReceiver.join``)."""
        if self.weights.rank() != 0:
            return None
        from ..collective import join_group

        group_id, world_size, store = self._pending
        self._pending = None
        self._group = join_group(group_id, world_size, store=store)

    def broadcast(self, bucket_bytes: int, engine_dtype: str | None = None):
        """Broadcast the weights bucket by bucket to the group (every rank takes part in the
        gathers under FSDP; rank 0 sends), wider floating tensors cast to ``engine_dtype``;
        rank 0 returns (version, number of buckets). Each bucket is packed into the reused host
        staging buffer; the broadcast of one bucket has returned before the next is packed."""
        from ..collective import broadcast_buckets

        weights = self.weights
        buckets = iter_buckets(weights.iter(engine_dtype=engine_dtype), bucket_bytes, pack=False)
        if weights.rank() != 0:
            for _ in buckets:
                pass
            return None
        if self._group is None:
            raise RuntimeError("CollectiveSender.broadcast: no weight group (open_group / join_group)")
        version = weights.version()
        if self._staging is None:
            self._staging = HostStaging()
        staging = self._staging

        def counted():
            self._sent_bytes = 0
            for b in buckets:
                self._sent_bytes += b.meta.nbytes
                yield staging.pack(b)
                del b  # one bucket held at a time, as broadcast_buckets does

        try:
            return version, broadcast_buckets(self._group, counted(), version)
        except Exception:
            self._group = None  # a broken group is re-formed by the next sync
            raise

    def sent_bytes(self) -> int | None:
        return self._sent_bytes if self.weights.rank() == 0 else None


class CollectiveReceiver(WeightReceiver):
    """A member of the weight group (one at a time)."""

    _group = None

    def join(self, group_id: str, host: str, port: int, world_size: int) -> int:
        """Join the learner's group (blocks until every member joined); returns this runner's
        rank in it. An older group is dropped."""
        from ..collective import join_group

        self._group = None
        self._group = join_group(group_id, world_size, host=host, port=port)
        return self._group.rank

    def group_id(self) -> str | None:
        """The id of the group this runner is in (None: none, e.g. after a restart)."""
        return None if self._group is None else self._group.group_id

    def receive(self) -> int:
        """Receive one broadcast into the engine, bucket by bucket; returns the weights version,
        the new one only if every bucket came."""
        from ..receiver import receive_broadcast

        weights = self.weights
        weights.settle()
        weights.begin_update()
        try:
            complete, version = receive_broadcast(weights.engine, self._group)
        except Exception:
            self._group = None
            raise
        finally:
            weights.end_update()
        if complete:
            weights.version = version
        return weights.version


@register_transport("collective")
class CollectiveTransport(Transport):
    """A gloo broadcast from learner rank 0 to every remote runner."""

    sender = CollectiveSender
    receiver = CollectiveReceiver
    fallback = "object_store"

    def __init__(self, settings) -> None:
        super().__init__(settings)
        self._group: dict | None = None  # {"group_id", "size"} of the formed group

    @property
    def ready(self) -> bool:
        return self._group is not None

    def unavailable(self, placement: Placement) -> str:
        if placement.local_runner_only:
            return "the runner is the driver's local runner"
        if placement.healthy_remote_runners() == 0:
            return "no healthy remote runner"
        return ""

    def sync(self, placement: Placement) -> tuple[list[int], int]:
        cls = type(self)
        ids = placement.on_receivers(cls, lambda r: r.group_id(), remote_only=True)
        group = self._group
        if group is None or ids != [group["group_id"]] * len(ids) or len(ids) != group["size"]:
            self._group = None
            group = self._group = self._form(placement)
        wire = placement.engine_dtype()
        bucket_bytes = self.settings.bucket_bytes
        sent: list = []
        try:
            versions = placement.on_receivers_while(
                cls, lambda r: r.receive(),
                lambda: sent.append(placement.on_senders(cls, lambda s: s.broadcast(bucket_bytes, engine_dtype=wire))))
        except Exception:
            self._group = None  # re-form on the next sync
            raise
        if len(versions) != group["size"]:  # a member failed meanwhile: re-form the group next time
            self._group = None
            raise RuntimeError(f"weight group {group['group_id']}: {len(versions)} of {group['size']} runners answered")
        return versions, int(sent[0][0])

    def _form(self, placement: Placement) -> dict:
        """A new group of learner rank 0 and every healthy remote runner."""
        cls = type(self)
        n = placement.healthy_remote_runners()
        group_id = f"weights-{uuid.uuid4().hex[:12]}"
        host, port = placement.on_senders(cls, lambda s: s.open_group(group_id, n + 1))
        ranks = placement.on_receivers_while(cls, lambda r: r.join(group_id, host, port, n + 1),
                                             lambda: placement.on_every_sender(cls, lambda s: s.join_group()))
        if sorted(ranks) != list(range(1, n + 1)):
            raise RuntimeError(f"weight group {group_id}: runner ranks {ranks}, expected 1..{n}")
        logger.info("weight group %s formed: learner rank 0 and %d runners on %s:%d", group_id, n, host, port)
        return {"group_id": group_id, "size": n}
