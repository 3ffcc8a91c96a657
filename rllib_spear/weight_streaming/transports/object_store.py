"""Transport "object_store": one Ray object per bucket, pipelined (docs/design.md "Weight
streaming"; the wire format: ``weight_streaming/object_store.py``).

The driver asks learner rank 0 for one bucket at a time (every rank takes part under FSDP) and
hands each bucket's metadata and ref to every runner as soon as it is in the store, never a
tensor; a runner applies bucket k in the background while the learner puts bucket k+1, and takes
the new version only when every bucket arrived, in order. Buckets travel in the engines' weight
dtype (fp32 master weights reach bf16 engines as half the bytes). CPU tensors go into the store
straight from themselves; device tensors go through the sender's reused host staging buffer
(``weight_streaming/staging.py``: packed on the device, one copy to pinned memory), which
``ray.put`` copies out of before the next bucket is staged.
"""
from __future__ import annotations

from typing import Any, Iterator

from ..buckets import iter_buckets
from ..object_store import WeightManifest, put_bucket
from ..receiver import BucketStream
from ..registry import register_transport
from ..staging import HostStaging, on_host
from ..transport import Placement, Transport, WeightReceiver, WeightSender

__all__ = ["ObjectStoreTransport", "ObjectStoreSender", "ObjectStoreReceiver"]


class ObjectStoreSender(WeightSender):
    """Puts the weights into the object store one bucket per call; rank 0 keeps the refs (it
    owns the objects) until :meth:`release`."""

    _stream = None  # the buckets still to put
    _next = None  # the bucket the next call puts
    _manifest: WeightManifest | None = None  # the refs put so far (rank 0)
    _stream_bytes = 0  # bytes put for the last stream (in the wire dtype)
    _staging: HostStaging | None = None  # device buckets' host buffer (rank 0), kept between syncs

    def put_next(self, bucket_bytes: int, start: bool = False, engine_dtype: str | None = None):
        """One bucket per call, so that the driver can forward each bucket to the runners while
        this learner puts the next. ``start``: begin a new stream of the current weights (older
        unreleased refs are dropped). Every rank advances the stream by one bucket (under FSDP it
        gathers that bucket's tensors); rank 0 ``ray.put``s it and returns ``(version, meta,
        ref, last)``, the other ranks return None. ``last`` is True for the final bucket.
        ``engine_dtype`` (with ``start``; e.g. "bfloat16"): the engines' weight dtype, which
        wider floating tensors are cast to before they are put."""
        weights = self.weights
        sender = weights.rank() == 0
        if not sender and not weights.is_sharded:
            return None  # nothing to gather: rank 0 alone walks its weights
        if start:
            # unpacked: ray.put serialises each CPU tensor straight into the store (one copy) and
            # device buckets are staged only when put (_to_host); the other ranks cut the same
            # buckets from placeholders, one gathered bucket per call
            self._stream = iter_buckets(weights.iter(placeholders=True, engine_dtype=engine_dtype), bucket_bytes,
                                        pack=False)
            self._stream_bytes = 0
            self._manifest = WeightManifest(weights.version()) if sender else None
            self._next = next(self._stream, None)
            if self._next is None:
                self._stream = None
                if sender:
                    raise RuntimeError("weight sync: the module has no inference weights to send")
        stream = self._stream
        if stream is None:
            if sender:
                raise RuntimeError("ObjectStoreSender.put_next: no weight stream in progress; call it with start=True")
            return None  # e.g. LoRA: the merge gathered everything at the start; rank 0 holds it
        bucket, self._next = self._next, None
        ref = put_bucket(self._to_host(bucket)) if sender else None
        meta = bucket.meta
        del bucket  # its tensors (gathered ones under FSDP) go before the next bucket's come
        self._next = next(stream, None)  # look ahead one bucket to know the last
        last = self._next is None
        if last:
            self._stream = None
        if not sender:
            return None
        man = self._manifest
        man.buckets.append(meta)
        man.refs.append(ref)
        self._stream_bytes += meta.nbytes
        return man.version, meta, ref, last

    def _to_host(self, bucket):
        """The bucket as ``put_bucket`` reads it: CPU tensors as they are (``ray.put`` copies them
        into the store, one copy), device tensors staged in the host buffer (``ray.put`` has
        copied them out of it when it returns, before the next bucket reuses it)."""
        if on_host(bucket):
            return bucket
        if self._staging is None:
            self._staging = HostStaging()
        return self._staging.pack(bucket)

    def release(self) -> None:
        """Drop the refs of the last stream (the objects are freed once no runner or driver
        holds them either), and the stream if it was left unfinished."""
        self._manifest = None
        self._stream = None
        self._next = None

    def sent_bytes(self) -> int | None:
        """Bytes rank 0 put in the object store for the last (or current) stream."""
        return self._stream_bytes if self.weights.rank() == 0 else None


class ObjectStoreReceiver(WeightReceiver):
    """Applies the buckets of one version in a background thread (``BucketStream``) while the
    next ones are put."""

    _stream: BucketStream | None = None

    def receive(self, version: int, meta: Any, ref: Any, last: bool) -> int | None:
        """One bucket (its ``BucketMeta`` and object ref). The first bucket of a new version
        starts a stream; the call returns at once. The ``last`` one waits for the stream and
        returns the weights version, the new one only when every bucket was applied in order;
        the other calls return None. The version already held is skipped; a stream of another
        version still open is abandoned first."""
        weights = self.weights
        seq = int(version)
        stream = self._stream
        if stream is not None and stream.version != seq:
            weights.settle()
            stream = None
        if stream is None and seq != 0 and seq == weights.version:
            return weights.version if last else None
        if stream is None:
            weights.begin_update()  # closed when the stream finishes or is abandoned
            stream = self._stream = BucketStream(weights.engine, seq)
            weights.left_open(self._abandon)
        stream.add(meta, ref)
        if not last:
            return None
        self._stream = None
        weights.left_open(None)
        try:
            if stream.finish(meta.index + 1):
                weights.version = seq
        finally:
            weights.end_update()
        return weights.version

    def _abandon(self) -> None:
        """The driver stopped sending: the buckets applied so far stay, the version stays old."""
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.abort()
            finally:
                self.weights.end_update()


@register_transport("object_store")
class ObjectStoreTransport(Transport):
    """Learner rank 0 puts bucket k+1 while every runner applies bucket k."""

    sender = ObjectStoreSender
    receiver = ObjectStoreReceiver

    def sync(self, placement: Placement) -> tuple[list[int], int]:
        versions, version = [], None
        wire = placement.engine_dtype()
        try:
            for version, meta, ref, last in self.stream(placement, wire):
                versions = self.send(placement, version, meta, ref, last)
        finally:
            self.release(placement)
        return versions, version

    def stream(self, placement: Placement, engine_dtype: str | None = None) -> Iterator[tuple[int, Any, Any, bool]]:
        """``(version, meta, ref, last)`` of each bucket as soon as learner rank 0 put it (the
        learner keeps the refs until :meth:`release`)."""
        cls, bucket_bytes, start = type(self), self.settings.bucket_bytes, True
        while True:
            version, meta, ref, last = placement.on_senders(
                cls, lambda s, st=start: s.put_next(bucket_bytes, start=st, engine_dtype=engine_dtype))
            start = False
            yield version, meta, ref, last
            if last:
                return

    def send(self, placement: Placement, version: int, meta: Any, ref: Any, last: bool) -> list:
        """One bucket to every runner; the call with ``last`` returns their versions."""
        return placement.on_receivers(type(self), lambda r, v=version, m=meta, f=ref, e=last: r.receive(v, m, f, e))

    def release(self, placement: Placement) -> None:
        """The learner drops the refs of its last stream (the objects go once the runners are done)."""
        placement.on_every_sender(type(self), lambda s: s.release(), raise_errors=False)
