"""Transport "shared_memory": learner rank 0 keeps its weights in named shared memory and sends
only their handle; every runner (on its node) loads them straight from there (docs/design.md
"Weight streaming"; the blocks and their reader: ``weight_streaming/shared_memory.py``).

Blocks keep their names only until every runner has mapped them; a runner that has not (it
restarted since) answers None, and the learner then shares new blocks, which every runner maps.
It runs when the learner's weights are whole CPU tensors used as they are (not sharded, no LoRA)
and every runner is on learner rank 0's node; asked again when the healthy runners change (a
restarted runner may be placed on another node).
"""
from __future__ import annotations

from ..registry import register_transport
from ..learner_side import engine_state_dict
from ..transport import Placement, Transport, WeightReceiver, WeightSender

__all__ = ["SharedMemoryTransport", "SharedMemorySender", "SharedMemoryReceiver"]


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


class SharedMemorySender(WeightSender):
    """Rank 0's weights, moved into shared memory at the first sync (``SharedWeights``)."""

    _shared = None  # the blocks that hold the weights

    def unsupported(self) -> str:
        """Why these weights cannot live in shared memory, or "" when they can: they must be
        whole CPU tensors, used as they are."""
        weights = self.weights
        if weights.is_sharded:
            return "the learner is sharded (sharding='fsdp'): its weights are gathered per sync"
        if weights.merged():
            return "the module has LoRA adapters: the engines get merged weights, computed per sync"
        if any(t.device.type != "cpu" for t in weights.model()[1].state_dict().values()):
            return "the learner's weights are not on the CPU"
        return ""

    def availability(self) -> tuple[str, str] | None:
        """Rank 0: (why it cannot share, "" when it can; its node); the other ranks None."""
        if self.weights.rank() != 0:
            return None
        return self.unsupported(), _node_id()

    def share(self, refresh: bool = False):
        """Rank 0 keeps its inference weights in named shared memory and returns a
        ``SharedWeightsHandle`` (block names, layout, version, node); the other ranks return
        None. The weights move into new blocks at the first call, with ``refresh`` (new runners
        must map them) and when a parameter was re-allocated since; new blocks keep their names
        until :meth:`unlink`."""
        from ..shared_memory import SharedWeights

        weights = self.weights
        if weights.rank() != 0:
            return None
        named = list(engine_state_dict(weights.model()[1], keep_vars=True).items())
        shared = self._shared
        if shared is None or refresh or not shared.holds(named):
            why = self.unsupported()  # checked when (re-)sharing, not every sync
            if why:
                raise ValueError(f"weight_sync_transport='shared_memory' cannot run: {why}; use 'object_store'")
            if shared is not None:
                shared.unlink()
            shared = self._shared = SharedWeights(named)
        return shared.handle(weights.version(), _node_id())

    def unlink(self) -> None:
        """Remove the names of the shared blocks (every runner has mapped them): nothing is left
        in /dev/shm however the processes end."""
        if self._shared is not None:
            self._shared.unlink()


class SharedMemoryReceiver(WeightReceiver):
    """Maps the learner's blocks (once; kept across syncs) and streams views of them into the
    engine's load."""

    _reader = None

    def node_id(self) -> str:
        return _node_id()

    def read(self, handle) -> int | None:
        """Load the learner's weights from its shared memory (this runner must be on the
        learner's node); returns the weights version, or None when the blocks lost their names
        before this runner mapped them (a runner that restarted since): the driver then has the
        learner share new blocks. A version already held is skipped unless the blocks are new
        here."""
        from ..shared_memory import SharedWeightsReader

        node = _node_id()
        if handle.node_id != node:
            raise RuntimeError(f"weight_sync_transport='shared_memory': this runner is on node {node}, the "
                               f"learner's weights on {handle.node_id}; use 'auto' or 'object_store' across nodes")
        weights = self.weights
        weights.settle()
        if self._reader is None:
            self._reader = SharedWeightsReader()
        reader = self._reader
        if not reader.can_read(handle):
            return None
        seq = int(handle.version)
        if seq == 0 or seq != weights.version or not reader.has_mapped(handle):
            with weights.updating():
                weights.engine.load_weights_stream(reader.tensors(handle))
                weights.engine.version = seq
            weights.version = seq
        return weights.version

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()


@register_transport("shared_memory")
class SharedMemoryTransport(Transport):
    """The runners read learner rank 0's weights in place: no copy on the sender, one per runner."""

    sender = SharedMemorySender
    receiver = SharedMemoryReceiver
    wire_dtype = "learner"  # nothing travels but the handle; each engine casts while it loads

    def __init__(self, settings) -> None:
        super().__init__(settings)
        self._possible: tuple[tuple, str] | None = None  # (the healthy runners, why not) last asked

    def unavailable(self, placement: Placement) -> str:
        ids = placement.runner_ids()
        if self._possible is not None and self._possible[0] == ids:
            return self._possible[1]
        cls = type(self)
        why, node = placement.on_senders(cls, lambda s: s.availability())
        if not why:
            nodes = placement.on_receivers(cls, lambda r: r.node_id())
            if any(n != node for n in nodes):
                why = "some runners are on another node than learner rank 0"
        self._possible = (ids, why)
        return why

    def sync(self, placement: Placement) -> tuple[list[int], int]:
        cls = type(self)

        def share(refresh: bool):
            return placement.on_senders(cls, lambda s, r=refresh: s.share(refresh=r))

        def read(handle) -> list:
            return placement.on_receivers(cls, lambda r, h=handle: r.read(h))

        handle = share(False)
        try:
            versions = read(handle)
            if any(v is None for v in versions):
                if handle.linked:
                    raise RuntimeError("weight sync: a runner could not map the learner's shared weights")
                handle = share(True)
                versions = read(handle)
        finally:
            if handle.linked:
                placement.on_every_sender(cls, lambda s: s.unlink(), raise_errors=False)
        return versions, handle.version
