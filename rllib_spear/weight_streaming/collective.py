"""Transport "collective": a torch.distributed gloo group of the sender (learner rank 0, rank 0
of the group) and the runners' engines, apart from any default process group (the learners' own
DDP/FSDP group is untouched), formed on a TCP store opened on the sender's node
(docs/design.md "Weight streaming").

Per sync the sender broadcasts, for each bucket, a header (kind, length), the pickled
:class:`~rllib_spear.weight_streaming.buckets.BucketMeta`, then each dtype's flat buffer; a last
header carries the version and the number of buckets. The runners receive each bucket into
buffers allocated from its metadata and apply it before the next arrives.

The group is a ``ProcessGroupGloo`` built directly on a ``PrefixStore`` (no
``init_process_group``), so a process can be in it and in its learner group at once; the
buffers travel through host memory on every machine (no NCCL path yet).
"""
from __future__ import annotations

import datetime
import pickle
import socket
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import torch

from .buckets import Bucket, unpack_bucket

__all__ = ["WeightGroup", "open_store", "join_group", "broadcast_buckets", "iter_received",
           "DEFAULT_TIMEOUT_S"]

#: Seconds a member waits for the others (forming the group, each broadcast).
DEFAULT_TIMEOUT_S = 300.0

_BUCKET, _END = 1, 2


def _node_ip() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:  # pragma: no cover - ray without a node
        pass
    return socket.gethostbyname(socket.gethostname())


def open_store(world_size: int, timeout_s: float = DEFAULT_TIMEOUT_S):
    """(store, host, port): a master TCPStore on a free port of this node (the sender's)."""
    from torch.distributed import TCPStore

    host = _node_ip()
    store = TCPStore(host, 0, world_size, True, timeout=datetime.timedelta(seconds=timeout_s),
                     wait_for_workers=False)
    return store, host, int(store.port)


@dataclass
class WeightGroup:
    """One member's handle on a weight-sync group."""

    group_id: str
    rank: int
    world_size: int
    pg: Any
    store: Any

    def broadcast(self, t: torch.Tensor) -> None:
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([t], opts).wait()


def join_group(group_id: str, world_size: int, *, store=None, host: str | None = None,
               port: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> WeightGroup:
    """Join group ``group_id``: the sender passes its master ``store`` (rank 0); a receiver
    passes ``host``/``port`` and gets the next free rank from the store. Blocks until all
    ``world_size`` members joined."""
    from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = TCPStore(host, int(port), world_size, False, timeout=timeout)
        rank = int(PrefixStore(group_id, store).add("next_rank", 1))
        if rank >= world_size:
            raise RuntimeError(f"weight group {group_id}: more than {world_size - 1} receivers joined")
    else:
        rank = 0
    pg = ProcessGroupGloo(PrefixStore(group_id + "/pg", store), rank, world_size, timeout)
    return WeightGroup(group_id, rank, world_size, pg, store)


def _send_header(group: WeightGroup, kind: int, obj: Any) -> None:
    payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    group.broadcast(torch.tensor([kind, payload.numel()], dtype=torch.int64))
    group.broadcast(payload)


def _recv_header(group: WeightGroup) -> tuple[int, Any]:
    head = torch.zeros(2, dtype=torch.int64)
    group.broadcast(head)
    payload = torch.empty(int(head[1]), dtype=torch.uint8)
    group.broadcast(payload)
    return int(head[0]), pickle.loads(payload.numpy().tobytes())


def broadcast_buckets(group: WeightGroup, buckets: Iterable[Bucket], version: int) -> int:
    """Sender (rank 0): broadcast every bucket as it comes, then the end header; returns the
    number of buckets."""
    n = 0
    for b in buckets:
        _send_header(group, _BUCKET, b.meta)
        for dt in sorted(b.buffers):
            if b.buffers[dt].numel():
                group.broadcast(b.buffers[dt])
        n += 1
        del b
    _send_header(group, _END, {"version": int(version), "num_buckets": n})
    return n


def iter_received(group: WeightGroup, applied: list[int], end: dict) -> Iterator[tuple[str, torch.Tensor]]:
    """Receiver: (name, tensor) of each broadcast bucket, received into fresh buffers sized by
    its metadata (an engine's loader may keep the tensors of a layer until it is complete);
    appends each bucket's index to ``applied`` once consumed and fills ``end`` with the last
    header (``version``, ``num_buckets``)."""
    while True:
        kind, obj = _recv_header(group)
        if kind == _END:
            end.update(obj)
            return
        buffers = {dt: torch.empty(n, dtype=torch.uint8) for dt, n in sorted(obj.buffer_bytes.items())}
        for dt in sorted(buffers):
            if buffers[dt].numel():
                group.broadcast(buffers[dt])
        yield from unpack_bucket(obj, buffers)
        applied.append(obj.index)
        del buffers
