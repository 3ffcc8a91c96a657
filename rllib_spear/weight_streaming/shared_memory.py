"""Transport "shared_memory": the learner's inference weights live in named shared memory on
its node and the runners there read them straight into their engines (docs/design.md "Weight
streaming"). The CPU counterpart of the CUDA IPC handles that colocated trainers hand to
their inference engines: no copy on the sender and no intermediate store, one copy per runner.

* Sender (:class:`SharedWeights`, learner rank 0): the tensors are moved, once, into one
  ``multiprocessing.shared_memory`` block per dtype, laid out like a packed bucket
  (:class:`~rllib_spear.weight_streaming.buckets.BucketMeta`); each parameter's ``.data`` is
  re-pointed at its slice, so the optimizer keeps updating the same tensors, now shared. A sync
  sends only the :class:`SharedWeightsHandle` (block names and layout). New blocks keep their
  names only until every runner has mapped them; then they are unlinked, so nothing is left in
  /dev/shm whatever happens to the processes, and the memory goes with its last mapping.
* Receiver (:class:`SharedWeightsReader`, a runner on the same node): maps each block once and
  streams views of it into ``engine.load_weights_stream`` (the engine's own load path, so vLLM's
  fused layouts and the tied-head re-pack work as with the other transports).

The runner reads the learner's live tensors: the learner must not step while a sync runs (the
driver's sync sits between updates in both rollout pipelines).
"""
from __future__ import annotations

import logging
import mmap
import os
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import numpy as np
import torch

from .buckets import BucketMeta, bucket_meta, unpack_bucket

__all__ = ["SharedWeights", "SharedWeightsHandle", "SharedWeightsReader"]

logger = logging.getLogger(__name__)

#: Where POSIX shared memory lives on Linux (``shm_open`` names are files here).
_SHM_DIR = "/dev/shm"


@dataclass(frozen=True)
class SharedWeightsHandle:
    """What a sync sends: the weights version, the node the blocks are on, the layout (one
    packed-bucket metadata) and each dtype's block name."""

    version: int
    node_id: str
    meta: BucketMeta
    blocks: dict[str, str] = field(default_factory=dict)
    #: whether the blocks still have their names (new blocks: until every runner mapped them)
    linked: bool = True


def _map(name: str, nbytes: int) -> torch.Tensor:
    """Block ``name`` mapped into this process, as a flat uint8 tensor. The tensor owns the
    mapping (tensor -> numpy array -> mmap): it is unmapped only when no view of it is left, so
    no tensor can outlive its memory. Opened by path, so a reader registers nothing with its
    resource tracker (which would unlink the learner's block when the reader exits)."""
    fd = os.open(os.path.join(_SHM_DIR, name.lstrip("/")), os.O_RDWR)
    try:
        mm = mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)
    return torch.from_numpy(np.frombuffer(mm, dtype=np.uint8, count=nbytes))


def _views(meta: BucketMeta, blocks: dict[str, str]) -> dict[str, torch.Tensor]:
    """One flat uint8 tensor over each dtype's block (``blocks``: dtype -> block name)."""
    return {dt: _map(blocks[dt], n) for dt, n in meta.buffer_bytes.items() if n}


def _unique(named: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """``named`` with each tensor object once, under its first name (tied weights)."""
    items, seen = [], set()
    for name, t in named:
        if id(t) not in seen:
            seen.add(id(t))
            items.append((name, t))
    return items


class SharedWeights:
    """The sender's weights, moved into shared memory (see the module docstring).

    ``named``: (name, tensor) pairs of the tensors themselves (parameters or buffers: their
    ``.data`` is re-pointed), in the order the engines expect. A tensor seen twice (tied
    weights) is placed once under its first name.
    """

    def __init__(self, named: Iterable[tuple[str, torch.Tensor]]):
        from multiprocessing import shared_memory

        items = _unique(named)
        for name, t in items:
            if t.device.type != "cpu":
                raise ValueError(f"shared-memory weights must be CPU tensors; {name} is on {t.device}")
        if not os.path.isdir(_SHM_DIR):
            raise RuntimeError(f"shared-memory weights need {_SHM_DIR} (Linux); use the object store here")
        self.meta = bucket_meta(0, items)
        # SharedMemory picks a free name and registers the block with the resource tracker
        # (unlinked if this process dies); the tensors use a mapping of their own (see _map)
        self._blocks = {}
        self._unlinked = False
        for dt, n in self.meta.buffer_bytes.items():
            shm = shared_memory.SharedMemory(create=True, size=max(1, n))
            shm.close()
            self._blocks[dt] = shm
        views = _views(self.meta, self.block_names)
        with torch.no_grad():
            for (name, t), (_, dst) in zip(items, unpack_bucket(self.meta, views)):
                dst.copy_(t)
                t.data = dst  # the tensor object (and what holds it: optimizer, module) stays
        self._tensors = [t for _, t in items]
        self._ptrs = [t.data_ptr() for t in self._tensors]

    @property
    def block_names(self) -> dict[str, str]:
        return {dt: shm.name for dt, shm in self._blocks.items()}

    @property
    def nbytes(self) -> int:
        return self.meta.nbytes

    def holds(self, named: Iterable[tuple[str, torch.Tensor]]) -> bool:
        """Whether ``named`` are still exactly the shared tensors (same objects, same memory):
        something that re-allocated a parameter (``p.data = ...``) makes this False."""
        items = _unique(named)
        return ([n for n, _ in items] == self.meta.names
                and all(a is b for (_, a), b in zip(items, self._tensors))
                and [t.data_ptr() for t in self._tensors] == self._ptrs)

    def handle(self, version: int, node_id: str) -> SharedWeightsHandle:
        return SharedWeightsHandle(int(version), str(node_id), self.meta, self.block_names, self.linked)

    @property
    def linked(self) -> bool:
        return not self._unlinked

    def unlink(self) -> None:
        """Remove the blocks' names: nothing can map them any more, and nothing is left in
        /dev/shm if a process dies; the memory stays while the shared tensors and the runners'
        mappings of it do, and goes with the last of them."""
        if self._unlinked:
            return
        self._unlinked = True
        for shm in self._blocks.values():
            try:
                shm.unlink()
            except FileNotFoundError:
                pass



class SharedWeightsReader:
    """A runner's side: the blocks it has mapped (kept across syncs: mapping 500 MB costs more
    than copying it), and the tensors of a handle as views of them."""

    def __init__(self):
        self._maps: dict[str, torch.Tensor] = {}

    def has_mapped(self, handle: SharedWeightsHandle) -> bool:
        """Whether every block of ``handle`` is mapped here already."""
        return all(name in self._maps for dt, name in handle.blocks.items() if handle.meta.buffer_bytes.get(dt))

    def can_read(self, handle: SharedWeightsHandle) -> bool:
        """Whether ``handle`` can be read here: its blocks are mapped, or still have names."""
        return handle.linked or self.has_mapped(handle)

    def tensors(self, handle: SharedWeightsHandle) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) of every weight of ``handle``, as views of the shared blocks (read
        them before the learner's next step)."""
        names = set(handle.blocks.values())
        for name in [n for n in self._maps if n not in names]:  # a re-shared learner: new blocks
            del self._maps[name]
        views = {}
        for dt, name in handle.blocks.items():
            n = handle.meta.buffer_bytes.get(dt, 0)
            if not n:
                continue
            if name not in self._maps or self._maps[name].numel() != n:
                if not handle.linked:
                    raise RuntimeError(f"shared weights block {name} was unlinked before this runner mapped it; "
                                       "the learner must share new blocks (the driver does when the runners change)")
                self._maps[name] = _map(name, n)
            views[dt] = self._maps[name]
        yield from unpack_bucket(handle.meta, views)

    def close(self) -> None:
        """Forget the mappings (each goes once no view of it is left)."""
        self._maps = {}
