"""Transport "object_store": one Ray object per bucket (docs/design.md "Weight streaming").

The sender (learner rank 0) ``ray.put``s each packed bucket as it is produced and keeps the refs
(it owns the objects) until the driver releases them after every runner has applied the sync;
the driver forwards the :class:`WeightManifest` (refs and metadata, never tensors) to the
runners, and each runner fetches, applies and drops one bucket at a time.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import numpy as np
import torch

from .buckets import Bucket, BucketMeta, dtype_from_name

__all__ = ["WeightManifest", "put_buckets", "iter_manifest_tensors", "manifest_complete"]


@dataclass
class WeightManifest:
    """What the driver forwards to every runner: the version, every bucket's metadata and, for
    the object-store transport, one object ref per bucket (``refs[i]`` holds ``buckets[i]``)."""

    version: int
    buckets: list[BucketMeta] = field(default_factory=list)
    refs: list[Any] = field(default_factory=list)

    @property
    def num_buckets(self) -> int:
        return len(self.buckets)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)


def put_buckets(buckets: Iterable[Bucket], version: int, put=None) -> WeightManifest:
    """``ray.put`` each bucket as it comes, as a list of numpy uint8 arrays, one per tensor in
    ``meta.tensors`` order: serialising them writes each tensor's bytes straight into the store,
    one copy, so ``iter_buckets(pack=False)`` buckets need no packing first (packed buckets are
    sent as views of their buffers); the runner reads them zero-copy on its node. The caller owns
    the refs and must keep the manifest until the runners have fetched them. ``put``: ``ray.put``
    unless given."""
    if put is None:
        import ray

        put = ray.put
    man = WeightManifest(int(version))
    for b in buckets:
        man.buckets.append(b.meta)
        man.refs.append(put([t.numpy() for t in b.tensor_bytes()]))
        del b
    return man


def _as_tensor(arr: np.ndarray) -> torch.Tensor:
    with warnings.catch_warnings():  # the object store's arrays are read-only; we only read them
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)


def iter_manifest_tensors(manifest: WeightManifest, applied: list[int],
                          fetch=None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every bucket of ``manifest``, fetching one bucket at a time and dropping
    it before the next; appends each bucket's index to ``applied`` once all its tensors were
    consumed. Buckets without a ref (a dropped ref) are skipped: ``manifest_complete`` says so.
    ``fetch``: ``ray.get`` unless given."""
    if fetch is None:
        import ray

        fetch = ray.get
    for meta, ref in zip(manifest.buckets, manifest.refs):
        if ref is None:
            continue
        arrays = fetch(ref)
        if len(arrays) != len(meta.tensors):
            raise ValueError(f"weight bucket {meta.index}: {len(arrays)} arrays for {len(meta.tensors)} tensors")
        for spec, arr in zip(meta.tensors, arrays):
            yield spec.name, _as_tensor(arr).view(dtype_from_name(spec.dtype)).view(spec.shape)
        applied.append(meta.index)
        del arrays


def manifest_complete(manifest: WeightManifest, applied: list[int]) -> bool:
    """Whether every bucket of the manifest was applied, once each, in order."""
    return applied == [b.index for b in manifest.buckets] == list(range(manifest.num_buckets))
