"""Buckets of inference weights: bounded-size groups of whole tensors, each packed into one
contiguous byte buffer per dtype (docs/design.md "Weight streaming").

A bucket holds whole tensors in the order they come (the learner's state-dict order) while their
bytes stay within ``bucket_bytes``; a tensor larger than the bucket travels alone. The
:class:`BucketMeta` (names, shapes, dtypes, offsets) is small and goes through the driver; the
buffers go through a transport (Ray object refs or a collective broadcast).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator

import torch

__all__ = ["TensorSpec", "BucketMeta", "Bucket", "iter_buckets", "pack_bucket", "unpack_bucket",
           "bucket_meta", "as_bytes", "fill_buffers", "dtype_from_name"]


def dtype_from_name(name: str) -> torch.dtype:
    """``"float32"`` -> torch.float32 (the names ``str(dtype)`` gives, without ``torch.``)."""
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r}")
    return dt


@dataclass(frozen=True)
class TensorSpec:
    """Where one tensor lies in its bucket: ``buffers[dtype][offset:offset + nbytes]``."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int
    nbytes: int


@dataclass
class BucketMeta:
    """Bucket ``index`` of a sync: its tensors and the byte size of each dtype's buffer."""

    index: int
    tensors: list[TensorSpec] = field(default_factory=list)
    buffer_bytes: dict[str, int] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(self.buffer_bytes.values())

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tensors]


@dataclass
class Bucket:
    """A bucket's metadata and its buffers (one flat uint8 CPU tensor per dtype), or, unpacked
    (``iter_buckets(pack=False)``), no buffers and its ``items`` as they came."""

    meta: BucketMeta
    buffers: dict[str, torch.Tensor]
    items: list[tuple[str, torch.Tensor]] = field(default_factory=list)

    def tensor_bytes(self) -> list[torch.Tensor]:
        """Each tensor's bytes, in ``meta.tensors`` order, as flat uint8 CPU tensors: views of
        the buffers (packed) or of the tensors themselves (unpacked; a copy only for a tensor
        that is not a contiguous CPU tensor)."""
        if self.items:
            return [as_bytes(t) for _, t in self.items]
        return [self.buffers[s.dtype][s.offset:s.offset + s.nbytes] for s in self.meta.tensors]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes as a flat uint8 CPU tensor (a view when ``t`` is a contiguous CPU tensor)."""
    return t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)


def bucket_meta(index: int, items: list[tuple[str, torch.Tensor]]) -> BucketMeta:
    """The metadata of bucket ``index`` holding ``items``: per dtype, the tensors back to back."""
    meta = BucketMeta(index)
    for name, t in items:
        dt = str(t.dtype).removeprefix("torch.")
        off = meta.buffer_bytes.get(dt, 0)
        n = _nbytes(t)
        meta.tensors.append(TensorSpec(name, tuple(t.shape), dt, off, n))
        meta.buffer_bytes[dt] = off + n
    return meta


def fill_buffers(buffers: dict[str, torch.Tensor], meta: BucketMeta,
                 items: list[tuple[str, torch.Tensor]]) -> None:
    """Copy each of ``items``' tensors into its place (``meta``) in the per-dtype uint8
    ``buffers``, on whatever device the buffers are (a tensor's bytes are read on its own
    device, so device tensors fill a device buffer without a host round trip)."""
    for (_, t), spec in zip(items, meta.tensors):
        if spec.nbytes:
            flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
            buffers[spec.dtype][spec.offset:spec.offset + spec.nbytes].copy_(flat)


def pack_bucket(index: int, items: list[tuple[str, torch.Tensor]]) -> Bucket:
    """One contiguous host byte buffer per dtype holding ``items``' tensors back to back."""
    meta = bucket_meta(index, items)
    buffers = {dt: torch.empty(n, dtype=torch.uint8) for dt, n in meta.buffer_bytes.items()}
    fill_buffers(buffers, meta, items)
    return Bucket(meta, buffers)


def unpack_bucket(meta: BucketMeta, buffers: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of a bucket, as views into ``buffers`` (no copy)."""
    for spec in meta.tensors:
        flat = buffers[spec.dtype][spec.offset:spec.offset + spec.nbytes]
        yield spec.name, flat.view(dtype_from_name(spec.dtype)).view(spec.shape)


def iter_buckets(named_tensors: Iterable[tuple[str, torch.Tensor | None]],
                 bucket_bytes: int, pack: bool = True) -> Iterator[Bucket]:
    """Group ``(name, tensor)`` pairs, in order, into buckets of at most ``bucket_bytes`` (a
    tensor larger than that is a bucket of its own), packed into fresh buffers that the caller
    may keep (``pack``) or not (the senders: the object store serialises each CPU tensor
    straight into the store, and device tensors, or a collective's buckets, are packed into
    the sender's reused host buffer, ``staging.HostStaging``). Pairs whose tensor is None
    (ranks that only take part in the gathers, ``models.sharding.iter_full_state(keep=False)``)
    are consumed and yield nothing. Holds at most one bucket of tensors at a time."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")

    def make(index: int, items: list) -> Bucket:
        return pack_bucket(index, items) if pack else Bucket(bucket_meta(index, items), {}, items)

    pending: list[tuple[str, torch.Tensor]] = []
    size = 0
    index = 0
    for name, t in named_tensors:
        if t is None:
            continue
        n = _nbytes(t)
        if pending and size + n > bucket_bytes:
            yield make(index, pending)
            index += 1
            pending, size = [], 0
        pending.append((name, t))
        size += n
    if pending:
        yield make(index, pending)
