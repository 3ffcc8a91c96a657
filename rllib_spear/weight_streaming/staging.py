"""The host path of a weight bucket: one reused host staging buffer (docs/design.md "Weight
streaming", the host path).

The object-store and collective transports send host bytes. Copying a bucket of device tensors
to the host one tensor at a time into fresh pageable memory ran at about 1 GB/s on an H200; the
same bytes packed on the device and copied once into a pinned buffer that every bucket reuses
ran at 46 GB/s. :class:`HostStaging` does the latter:

1. the bucket's tensors (already in the wire dtype: ``LearnerWeights.iter`` casts on the
   device) are packed on their device into one flat byte buffer, laid out as the host buffer
   (one section per dtype, each section's tensors back to back in ``BucketMeta`` order);
2. one ``non_blocking`` copy moves it into the host buffer (pinned when the tensors are on a
   CUDA device), and the copying stream is synchronised once, before any byte is read;
3. the bucket comes back packed (:class:`~rllib_spear.weight_streaming.buckets.Bucket` with
   one buffer per dtype), its buffers views of the host buffer, so ``put_bucket``,
   ``broadcast_buckets`` and ``unpack_bucket`` read it with no further copy.

The host buffer is kept between buckets and syncs and grows only for a larger bucket. So a
staged bucket is valid only until the next :meth:`HostStaging.pack`: whoever sends it must be
done with its bytes by then. ``ray.put`` copies them into the object store before it returns,
and a gloo broadcast has sent them when its ``wait()`` returns; a transport that keeps a
reference to the bytes it was given (``shared_memory``) must not use staging.
"""
from __future__ import annotations

from typing import Iterable

import torch

from .buckets import Bucket, BucketMeta, fill_buffers

__all__ = ["HostStaging", "on_host", "pin_for", "section_offsets", "SECTION_ALIGN"]

#: Byte alignment of each dtype's section in the staging buffer (so that any section can be
#: viewed as its dtype in place).
SECTION_ALIGN = 64


def on_host(bucket: Bucket) -> bool:
    """Whether every tensor of an unpacked bucket is already a CPU tensor (the object store then
    serialises them straight from themselves: staging would add a copy)."""
    return all(t.device.type == "cpu" for _, t in bucket.items)


def pin_for(devices: Iterable[torch.device]) -> bool:
    """Whether the staging buffer for tensors on ``devices`` is pinned: when one of them is a CUDA
    device and CUDA is available (pinning needs CUDA; it is what makes the device-to-host copy
    a single DMA at full speed)."""
    return any(d.type == "cuda" for d in devices) and torch.cuda.is_available()


def section_offsets(meta: BucketMeta) -> tuple[dict[str, int], int]:
    """(the byte offset of each dtype's section in the staging buffer, the bytes it needs): the
    dtypes in sorted order (the collective's broadcast order), each section aligned to
    :data:`SECTION_ALIGN`."""
    offsets, end = {}, 0
    for dt in sorted(meta.buffer_bytes):
        start = -(-end // SECTION_ALIGN) * SECTION_ALIGN
        offsets[dt] = start
        end = start + meta.buffer_bytes[dt]
    return offsets, end


def _host_buffer(nbytes: int, pin: bool) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)


class HostStaging:
    """One sender's reused host buffer: :meth:`pack` stages one unpacked bucket into it.

    Held by a sender for its lifetime (one per transport a learner sends through); the buffer
    is allocated at the first bucket, grows only when a bucket needs more bytes (or needs it
    pinned and it is not), and is never shrunk: its size is the largest bucket sent so far.
    """

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None
        self._pinned = False

    @property
    def buffer(self) -> torch.Tensor | None:
        """The host buffer (None before the first bucket)."""
        return self._buffer

    @property
    def capacity(self) -> int:
        """Bytes of the host buffer (0 before the first bucket)."""
        return 0 if self._buffer is None else self._buffer.numel()

    @property
    def pinned(self) -> bool:
        return self._pinned

    def pack(self, bucket: Bucket) -> Bucket:
        """``bucket`` (unpacked: ``iter_buckets(pack=False)``) packed into the host buffer: the
        same metadata, one buffer per dtype, each a view of the host buffer. Valid until the
        next call (the buffer is reused)."""
        if not bucket.items:
            raise ValueError(f"HostStaging.pack: bucket {bucket.meta.index} is packed already or empty; "
                             "stage the unpacked buckets of iter_buckets(..., pack=False)")
        meta = bucket.meta
        offsets, nbytes = section_offsets(meta)
        devices = [t.device for _, t in bucket.items]
        host = self._reserve(nbytes, pin_for(devices))
        device = next((d for d in devices if d.type != "cpu"), None)
        if device is None:
            fill_buffers(_sections(host, meta, offsets), meta, bucket.items)
        else:
            # pack on the device (device bandwidth), then one copy to the host
            flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
            fill_buffers(_sections(flat, meta, offsets), meta, bucket.items)
            if device.type == "cuda":
                host.copy_(flat, non_blocking=True)
                torch.cuda.current_stream(device).synchronize()  # the bytes are on the host from here
            else:
                host.copy_(flat)
            del flat
        return Bucket(meta, _sections(host, meta, offsets))

    def release(self) -> None:
        """Free the host buffer (the next bucket allocates a new one)."""
        self._buffer = None
        self._pinned = False

    def _reserve(self, nbytes: int, pin: bool) -> torch.Tensor:
        """The first ``nbytes`` of the host buffer, (re)allocated when it is too small or not
        pinned as needed."""
        if self._buffer is None or self._buffer.numel() < nbytes or (pin and not self._pinned):
            self._buffer = None  # the old one goes before the larger one comes
            self._buffer = _host_buffer(max(nbytes, 1), pin)
            self._pinned = pin
        return self._buffer[:nbytes]


def _sections(flat: torch.Tensor, meta: BucketMeta, offsets: dict[str, int]) -> dict[str, torch.Tensor]:
    """Each dtype's section of ``flat`` (laid out by ``offsets``, :func:`section_offsets`)."""
    return {dt: flat[off:off + meta.buffer_bytes[dt]] for dt, off in offsets.items()}
