"""Transport "vllm": weights reach vLLM engines through vLLM's own weight-transfer API
(docs/design.md "Weight streaming", "The vLLM transport").

vLLM 0.32 splits an RL weight update into a trainer side and a worker side:

* worker side (inside every vLLM worker process, TP workers included): a
  ``WeightTransferEngine`` built from ``LLM(weight_transfer_config={"backend": ...})``, driven by
  ``init_weight_transfer_engine`` / ``start_weight_update`` / ``update_weights`` /
  ``finish_weight_update`` (each a ``collective_rpc`` carrying only small dicts: names, dtypes,
  shapes; the tensors travel on the backend's own channel). ``start`` opens vLLM's layerwise
  reload, ``finish`` closes it, so fused q/k/v and gate/up layers, TP slicing and tied
  embeddings are handled by vLLM's loaders.
* trainer side (learner rank 0 sends; every rank iterates the source so FSDP gathers stay in
  step): ``WeightTransferTrainerFactory.trainer_init(init_info, client=..., source=...)`` then
  ``send_weights()`` per sync.

Backends, by placement: ``nccl`` (vLLM's; engines on other GPUs or nodes), ``ipc`` (vLLM's; an
engine on the learner's own GPU, the colocated layout) and :data:`GLOO_BACKEND`, registered here
in both of vLLM's factories, for CPU machines: the same call sequence over a gloo group, so the
CPU tests drive what a GPU run drives. Importing this module registers it; inside vLLM's worker
processes the engines' ``worker_extension_cls`` (``env_runners/engines/vllm_worker.py``) imports
it (the multiprocess EngineCore and the TP workers do not inherit the parent's registry).

The source (:class:`EngineWeightSource`) yields the inference weights cast to the engine's dtype
on the sender, one tensor at a time (a bf16 engine gets half the bytes of an fp32 master copy).
"""
from __future__ import annotations

import datetime
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Iterator, Sequence

import torch
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

from .buckets import dtype_from_name
from .selection import GLOO_BACKEND, TRANSFER_BACKENDS

__all__ = ["GLOO_BACKEND", "BACKENDS", "register_backends", "plan_buckets",
           "GlooInitInfo", "GlooUpdateInfo", "GlooTrainerInitInfo", "GlooWeightTransferEngine",
           "GlooTrainerWeightTransferEngine", "EngineWeightSource", "RunnerClient",
           "trainer_init_info", "wire_bytes"]

logger = logging.getLogger(__name__)

#: ``weight_transfer_backend`` values: vLLM's GPU backends and the CPU one.
BACKENDS = TRANSFER_BACKENDS
#: Byte alignment of each tensor in a packed bucket (so a uint8 slice can be viewed as any dtype).
_ALIGN = 16
#: Seconds a member waits for the others (forming the group, each bucket).
DEFAULT_TIMEOUT_S = 300.0


def plan_buckets(nbytes: Sequence[int], bucket_bytes: int, align: int = _ALIGN) -> list[list[tuple[int, int]]]:
    """Cut tensors of the given byte sizes, in order, into buckets of at most ``bucket_bytes``
    (a larger tensor travels alone); each tensor's offset is rounded up to ``align``. Returns,
    per bucket, ``(tensor index, offset)`` pairs. Sender and receivers compute the same plan from
    the same metadata, so no per-bucket header travels."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    plan: list[list[tuple[int, int]]] = []
    used = 0
    for i, n in enumerate(nbytes):
        offset = -(-used // align) * align
        if not plan or (plan[-1] and offset + n > bucket_bytes):
            plan.append([])
            offset = 0
        plan[-1].append((i, offset))
        used = offset + n
    return plan


def _bucket_size(plan: list[tuple[int, int]], nbytes: Sequence[int]) -> int:
    i, off = plan[-1]
    return off + nbytes[i]


def wire_bytes(metas: Iterable[ParamMeta]) -> int:
    """Bytes of the tensors a sync sends (without bucket padding)."""
    return sum(_nbytes(m.shape, m.dtype) for m in metas)


def _nbytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n * torch.empty((), dtype=dtype).element_size()


# ---------------------------------------------------------------------------------- the group
@dataclass
class _Group:
    """A gloo group of the sender (rank 0) and every engine worker, on a TCP store opened by the
    sender (apart from any default process group: the learners' own group is untouched)."""

    rank: int
    world_size: int
    pg: Any
    store: Any

    def broadcast(self, t: torch.Tensor):
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        return self.pg.broadcast([t], opts)


def _join(host: str, port: int, group_id: str, rank: int, world_size: int, timeout_s: float,
          store=None) -> _Group:
    from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = TCPStore(host, int(port), world_size, False, timeout=timeout)
    pg = ProcessGroupGloo(PrefixStore(group_id, store), rank, world_size, timeout)
    return _Group(rank, world_size, pg, store)


# ---------------------------------------------------------------------------------- worker side
@dataclass(kw_only=True)
class GlooInitInfo(WeightTransferInitInfo):
    """Worker-side init info: where the sender's store is, this engine's first rank in the group
    (``rank_offset``: engines of several runners share one group, each its own block of ranks)."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_id: str
    bucket_bytes: int
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    """Per-sync metadata: the tensors in send order (the bucket plan follows from it)."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not (len(self.names) == len(self.dtype_names) == len(self.shapes)):
            raise ValueError(f"GlooUpdateInfo: {len(self.names)} names, {len(self.dtype_names)} dtypes, "
                             f"{len(self.shapes)} shapes")


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """Worker side of :data:`GLOO_BACKEND`: receives packed buckets over the gloo group and loads
    each through the model's ``load_weights`` inside vLLM's layerwise reload (opened by
    ``start_weight_update``, closed by ``finish_weight_update``), as vLLM's NCCL engine does."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: _Group | None = None
        self.bucket_bytes = 0

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        # the same global rank rule as vLLM's NCCL backend: data-parallel index, then TP x PP rank
        pc = self.parallel_config
        rank = pc.data_parallel_index * pc.world_size + pc.rank + init_info.rank_offset
        self.shutdown()
        self.bucket_bytes = int(init_info.bucket_bytes)
        self.group = _join(init_info.master_address, init_info.master_port, init_info.group_id, rank,
                           init_info.world_size, init_info.timeout_s)

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # the base class ends with torch.accelerator.synchronize(), which raises on a CPU build
        self.receive_weights(self.parse_update_info(update_info))
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError(f"{GLOO_BACKEND}: no group; call init_weight_transfer_engine first")
        dtypes = [dtype_from_name(d) for d in update_info.dtype_names]
        nbytes = [_nbytes(s, d) for s, d in zip(update_info.shapes, dtypes)]
        plan = plan_buckets(nbytes, self.bucket_bytes)

        def post(k: int):
            # a fresh buffer per bucket: a layerwise loader may keep a layer's tensors until the
            # layer is complete
            buf = torch.empty(_bucket_size(plan[k], nbytes), dtype=torch.uint8)
            return self.group.broadcast(buf), buf

        pending = post(0) if plan else None
        for k, bucket in enumerate(plan):
            work, buf = pending
            work.wait()
            # receive bucket k+1 while bucket k is loaded
            pending = post(k + 1) if k + 1 < len(plan) else None
            pairs = [(update_info.names[i], buf[off:off + nbytes[i]].view(dtypes[i]).view(update_info.shapes[i]))
                     for i, off in bucket]
            self.model.load_weights(weights=pairs)

    def shutdown(self) -> None:
        self.group = None


# ---------------------------------------------------------------------------------- trainer side
@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    """Trainer-side init info of :data:`GLOO_BACKEND` (rank 0 opens the store)."""

    backend: ClassVar[str] = GLOO_BACKEND

    master_address: str
    master_port: int
    world_size: int
    group_id: str
    bucket_bytes: int
    timeout_s: float = DEFAULT_TIMEOUT_S


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """Trainer side of :data:`GLOO_BACKEND`: rank 0 joins the group as rank 0, drives the
    engines' start / update / finish through the client and broadcasts packed buckets (bucket
    k+1 is packed while bucket k is on the wire); the other trainer ranks only iterate the source
    (their FSDP gathers)."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(self, *, client, source, is_sender: bool = True, bucket_bytes: int = 2**28) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.bucket_bytes = int(bucket_bytes)
        self.group: _Group | None = None
        self.sent_bytes = 0

    @classmethod
    def trainer_init(cls, init_info: GlooTrainerInitInfo, *, client, source=None):
        if source is None:
            raise ValueError(f"{GLOO_BACKEND}: the trainer needs a WeightSource")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender,
                     bucket_bytes=init_info.bucket_bytes)
        if not engine.is_sender:
            return engine
        from torch.distributed import TCPStore

        store = TCPStore(init_info.master_address, int(init_info.master_port), init_info.world_size, True,
                         timeout=datetime.timedelta(seconds=init_info.timeout_s), wait_for_workers=False)
        worker_info = asdict(GlooInitInfo(
            master_address=init_info.master_address, master_port=int(store.port), rank_offset=1,
            world_size=init_info.world_size, group_id=init_info.group_id, bucket_bytes=init_info.bucket_bytes,
            timeout_s=init_info.timeout_s))
        # the workers block in init until every member joined: join beside them
        with ThreadPoolExecutor(max_workers=1) as pool:
            future = pool.submit(client.init_weight_transfer_engine, worker_info)
            engine.group = _join(init_info.master_address, int(store.port), init_info.group_id, 0,
                                 init_info.world_size, init_info.timeout_s, store=store)
            future.result()
        return engine

    def send_weights(self, weight_version: str | None = None) -> None:
        """One full sync; ``weight_version`` is handed to ``finish_weight_update`` (None: the
        client's own, as with vLLM's engines)."""
        source = self.source
        metas = source.metadata()
        if not self.is_sender:
            for _ in source:
                pass
            return
        if self.group is None:
            raise RuntimeError(f"{GLOO_BACKEND}: trainer_init did not form a group")
        info = GlooUpdateInfo(names=[m.name for m in metas], dtype_names=[str(m.dtype).removeprefix("torch.")
                                                                          for m in metas],
                              shapes=[list(m.shape) for m in metas])
        self.client.start_weight_update()
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            future = pool.submit(self.client.update_weights, asdict(info))
            self.sent_bytes = self._broadcast(source, metas, future)
            future.result()
        finally:
            # never join the RPC thread after a failed broadcast: the receivers would be blocked
            # in the matching collective until its timeout
            pool.shutdown(wait=False)
        self.client.finish_weight_update(weight_version)

    def _broadcast(self, source: WeightSource, metas: list[ParamMeta], future) -> int:
        nbytes = [_nbytes(m.shape, m.dtype) for m in metas]
        plan = plan_buckets(nbytes, self.bucket_bytes)
        # the learner's tensors, cast while they are copied into the bucket (one pass) when the
        # source offers them uncast
        uncast = getattr(source, "iter_uncast", None)
        it = uncast() if uncast is not None else iter(source)
        pending = None  # (work, buffer) of the bucket on the wire
        sent = 0
        for bucket in plan:
            buf = torch.empty(_bucket_size(bucket, nbytes), dtype=torch.uint8)
            for i, off in bucket:
                name, t = next(it)
                m = metas[i]
                cast_ok = uncast is not None and t.dtype.is_floating_point and m.dtype.is_floating_point
                if name != m.name or (t.dtype != m.dtype and not cast_ok) or tuple(t.shape) != tuple(m.shape):
                    raise ValueError(f"weight source disagrees with its metadata at {i}: declared {m.name!r} "
                                     f"{m.dtype} {tuple(m.shape)}, got {name!r} {t.dtype} {tuple(t.shape)}")
                buf[off:off + nbytes[i]].view(m.dtype).view(m.shape).copy_(t.detach())
                del t
            if future.done():
                future.result()  # a receiver failed before the data: raise instead of blocking
            if pending is not None:
                pending[0].wait()
            pending = (self.group.broadcast(buf), buf)
            sent += int(buf.numel())
        if next(it, None) is not None:
            raise ValueError("weight source yields more tensors than its metadata declares")
        if pending is not None:
            pending[0].wait()
        return sent

    def shutdown(self) -> None:
        self.group = None


# ---------------------------------------------------------------------------------- source
class EngineWeightSource(WeightSource):
    """The learner's inference weights as vLLM's trainer API wants them: ``metadata()`` without
    gathering (names, full shapes, wire dtype), iteration one whole tensor at a time, floating
    tensors cast to the engine's dtype on the sender (``wire_dtype``; None keeps the learner's).

    ``named_shapes``: (name, shape, dtype) of every tensor, in order, on every rank.
    ``iterate``: a fresh pass of (name, tensor or None) pairs (None on ranks that only take part
    in the gathers), e.g. ``learner_side.LearnerWeights.iter``."""

    def __init__(self, named_shapes: Sequence[tuple[str, Sequence[int], torch.dtype]],
                 iterate: Callable[[], Iterator[tuple[str, torch.Tensor | None]]],
                 wire_dtype: torch.dtype | None = None) -> None:
        self._metas = [ParamMeta(n, self._wire(d, wire_dtype), tuple(int(x) for x in s)) for n, s, d in named_shapes]
        self._iterate = iterate
        self.wire_dtype = wire_dtype

    @staticmethod
    def _wire(dtype: torch.dtype, wire_dtype: torch.dtype | None) -> torch.dtype:
        return wire_dtype if wire_dtype is not None and dtype.is_floating_point else dtype

    def metadata(self) -> list[ParamMeta]:
        return list(self._metas)

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, t in self._iterate():
            if t is not None and t.dtype.is_floating_point and self.wire_dtype is not None:
                t = t.to(self.wire_dtype)  # one tensor cast at a time, on the sender
            yield name, t

    def iter_uncast(self) -> Iterator[tuple[str, torch.Tensor | None]]:
        """The same pass without the cast (metadata's dtypes still say the wire dtype): for a
        backend that casts while it copies into its send buffer (the gloo one)."""
        return self._iterate()


# ---------------------------------------------------------------------------------- client
class RunnerClient:
    """vLLM's ``VLLMWeightSyncClient`` over the env runners that hold the engines: each call goes
    to every runner at once and waits for all. A runner is a Ray actor handle (the call goes to
    its receiver of transport "vllm", ``LLMEnvRunner.weight_receiver_call``) or an object in this
    process with the engine's transfer methods (a ``VLLMReceiver``, or an engine itself). Engines
    of several runners share one group: runner ``i`` gets its own ``rank_offset`` (1 + the world
    sizes of the runners before it), which vLLM's single-client protocol has no place for."""

    def __init__(self, runners: Sequence[Any], world_sizes: Sequence[int]) -> None:
        if len(runners) != len(world_sizes):
            raise ValueError(f"{len(runners)} runners, {len(world_sizes)} world sizes")
        self.runners = list(runners)
        self.offsets = [1 + sum(world_sizes[:i]) for i in range(len(runners))]
        self.world_size = 1 + sum(int(w) for w in world_sizes)
        #: the group's id, handed to the runners at init (they report it: a runner that restarted
        #: reports none, and the driver re-forms the group)
        self.group_id: str | None = None
        #: the version ``finish_weight_update`` commits when vLLM's trainer engines call it
        #: without one (they do: their ``send_weights`` takes no version)
        self.pending_version: int | None = None

    def _call(self, method: str, per_runner: Callable[[int], tuple] = lambda i: ()) -> list:
        remote = [hasattr(getattr(r, "weight_receiver_call", None), "remote") for r in self.runners]
        if all(remote):
            import ray

            return ray.get([r.weight_receiver_call.remote("vllm", method, *per_runner(i))
                            for i, r in enumerate(self.runners)])
        if any(remote):
            raise TypeError("RunnerClient: a mix of Ray actor handles and local runners")
        if len(self.runners) == 1:
            return [getattr(self.runners[0], method)(*per_runner(0))]
        # local runners must enter a collective together: one thread each
        with ThreadPoolExecutor(max_workers=len(self.runners)) as pool:
            futures = [pool.submit(getattr(r, method), *per_runner(i)) for i, r in enumerate(self.runners)]
            return [f.result() for f in futures]

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._call("init_weight_transfer", lambda i: (dict(init_info, rank_offset=self.offsets[i]), self.group_id))

    def start_weight_update(self) -> None:
        self._call("start_weight_update")

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self._call("receive_weight_update", lambda i: (update_info,))

    def finish_weight_update(self, weight_version: str | None = None) -> list:
        version = int(weight_version) if weight_version is not None else self.pending_version
        if version is None:
            raise ValueError("RunnerClient.finish_weight_update: no version (set pending_version before sending)")
        return self._call("finish_weight_update", lambda i: (version,))

    def shutdown_weight_transfer_engine(self) -> None:
        self._call("shutdown_weight_transfer")


def trainer_init_info(backend: str, *, rank: int, world_size: int, group_id: str, bucket_bytes: int,
                      host: str | None = None, port: int = 0,
                      timeout_s: float = DEFAULT_TIMEOUT_S) -> TrainerInitInfo:
    """The trainer init info of ``backend`` (vLLM's ``nccl`` / ``ipc`` or :data:`GLOO_BACKEND`).
    ``port`` 0: the sender opens its store on a free port (gloo); nccl needs a fixed free port.
    ``timeout_s``: how long a gloo member waits for the others (a sender that failed mid-sync
    leaves the engines waiting this long before their update fails)."""
    if backend == GLOO_BACKEND:
        return GlooTrainerInitInfo(rank=rank, master_address=host or "127.0.0.1", master_port=port,
                                   world_size=world_size, group_id=group_id, bucket_bytes=bucket_bytes,
                                   timeout_s=timeout_s)
    if backend == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        return NCCLTrainerInitInfo(rank=rank, master_address=host or "127.0.0.1", master_port=port or _free_port(),
                                   world_size=world_size, packed=True,
                                   packed_buffer_size_bytes=max(bucket_bytes, 2**20))
    if backend == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        return IPCTrainerInitInfo(rank=rank, packed=True, packed_buffer_size_bytes=max(bucket_bytes, 2**20))
    raise ValueError(f"weight_transfer_backend must be one of {BACKENDS}, got {backend!r}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def register_backends() -> None:
    """Register :data:`GLOO_BACKEND` in vLLM's worker and trainer factories (once per process)."""
    for factory, cls in ((WeightTransferEngineFactory, GlooWeightTransferEngine),
                         (WeightTransferTrainerFactory, GlooTrainerWeightTransferEngine)):
        try:
            factory.register_engine(GLOO_BACKEND, cls)
        except ValueError:  # already registered (a module re-import)
            pass


register_backends()
