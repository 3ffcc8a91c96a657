"""Transport "object_store": one Ray object per bucket (docs/design.md "Weight streaming").

The sender (learner rank 0) ``ray.put``s one bucket per driver call and returns its metadata and
ref; it keeps the refs (it owns the objects) in a :class:`WeightManifest` until the driver
releases them after every runner has applied the sync. The driver forwards each (metadata, ref)
to the runners as soon as it has it, never a tensor, and each runner applies the buckets in
order, one fetched bucket at a time (``receiver.BucketStream``), while the sender puts the next.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import numpy as np
import torch

from .buckets import Bucket, BucketMeta, dtype_from_name

__all__ = ["WeightManifest", "put_bucket", "iter_bucket_tensors"]


@dataclass
class WeightManifest:
    """The sender's record of one sync: the version, every bucket's metadata and, for the
    object-store transport, one object ref per bucket (``refs[i]`` holds ``buckets[i]``)."""

    version: int
    buckets: list[BucketMeta] = field(default_factory=list)
    refs: list[Any] = field(default_factory=list)

    @property
    def num_buckets(self) -> int:
        return len(self.buckets)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)


def put_bucket(bucket: Bucket, put=None) -> Any:
    """``ray.put`` one bucket as a list of numpy uint8 arrays, one per tensor in ``meta.tensors``
    order, and return its ref. Serialising them writes each tensor's bytes straight into the
    store, one copy, so ``iter_buckets(pack=False)`` buckets need no packing first (packed
    buckets are sent as views of their buffers); a runner on the same node reads them zero-copy.
    The object is a snapshot at put time. ``put``: ``ray.put`` unless given."""
    if put is None:
        import ray

        put = ray.put
    return put([t.numpy() for t in bucket.tensor_bytes()])


def _as_tensor(arr: np.ndarray) -> torch.Tensor:
    with warnings.catch_warnings():  # the object store's arrays are read-only; we only read them
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)


def iter_bucket_tensors(buckets: Iterable[tuple[BucketMeta, Any]], applied: list[int],
                        fetch=None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every (metadata, ref) bucket, fetching one bucket at a time and dropping
    it before the next; appends each bucket's index to ``applied`` once all its tensors were
    consumed. ``fetch``: ``ray.get`` unless given."""
    if fetch is None:
        import ray

        fetch = ray.get
    for meta, ref in buckets:
        arrays = fetch(ref)
        del ref
        if len(arrays) != len(meta.tensors):
            raise ValueError(f"weight bucket {meta.index}: {len(arrays)} arrays for {len(meta.tensors)} tensors")
        for spec, arr in zip(meta.tensors, arrays):
            yield spec.name, _as_tensor(arr).view(dtype_from_name(spec.dtype)).view(spec.shape)
        applied.append(meta.index)
        del arrays
