"""The runner's side of the weight sync (docs/design.md "Weight streaming"): its engine and the
weights version it holds (:class:`EngineWeights`), and the receivers it holds, one per transport
that has sent to it (:class:`WeightReceivers`, ``runner.weight_receivers``).

The version is what the runner reports to the driver's version check and stamps on every
trajectory: a receiver sets it only once the whole new version is in the engine. While the
weights change, the engine's update gate is open (``engines/update_gate.py``): a runner that
samples in the background (``rollout_pipeline="async"``) holds new batches until it closes.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:
    from .transport import Transport, WeightReceiver

__all__ = ["EngineWeights", "WeightReceivers"]


class EngineWeights:
    """A runner's engine and the version of the weights it holds (0: the initial weights; -1:
    none valid, e.g. after the engine dropped them). ``actor``: how a sender in another process
    reaches this runner (its Ray actor handle; None for the driver's local runner, reached in
    its own process)."""

    def __init__(self, engine: Any, *, version: int = 0, actor: Callable[[], Any] | None = None) -> None:
        self.engine = engine
        self.version = int(version)
        self._actor = actor
        self._unfinished: Callable[[], None] | None = None

    def actor(self) -> Any:
        """This runner's Ray actor handle, or None when it is the driver's local runner."""
        return None if self._actor is None else self._actor()

    def dtype(self) -> str | None:
        """The dtype the engine holds its weights in ("bfloat16", ...; None when it does not
        say): the senders cast wider floating tensors to it."""
        dtype = getattr(self.engine, "weight_dtype", None)
        return None if dtype is None else str(dtype).removeprefix("torch.")

    # ------------------------------------------------------------------ an update in progress
    def begin_update(self) -> None:
        """The engine's weights are about to change: wait for the batch decoding in the
        background, hold new ones. An engine that is not a ``GenerationEngine`` (a duck-typed
        one) has no gate: nothing to wait for."""
        gate = getattr(self.engine, "update_gate", None)
        if gate is not None:
            gate.begin()

    def end_update(self) -> None:
        gate = getattr(self.engine, "update_gate", None)
        if gate is not None:
            gate.end()

    @contextlib.contextmanager
    def updating(self) -> Iterator[None]:
        """The gate open for the body (closed however it ends)."""
        self.begin_update()
        try:
            yield
        finally:
            self.end_update()

    def left_open(self, abandon: Callable[[], None] | None) -> None:
        """A receiver's update stays open across calls (an object-store stream); ``abandon``
        closes it. None: nothing is left open."""
        self._unfinished = abandon

    def settle(self) -> None:
        """Abandon an update left open (its sender stopped sending) before the engine is used for
        anything else; the version stays the old one."""
        abandon, self._unfinished = self._unfinished, None
        if abandon is not None:
            abandon()


class WeightReceivers:
    """The receivers a runner holds, one per transport, built on first use from its
    :class:`EngineWeights` (``weights``)."""

    def __init__(self, weights: EngineWeights) -> None:
        self.weights = weights
        self._receivers: dict[str, "WeightReceiver"] = {}

    def of(self, transport: str | type["Transport"]) -> "WeightReceiver":
        """The receiver of ``transport`` (its class, or its registered name)."""
        from .registry import transport_class  # (the registry imports the built-ins, which import this module)

        cls = transport_class(transport)
        receiver = self._receivers.get(cls.name)
        if receiver is None:
            receiver = self._receivers[cls.name] = cls.receiver(self.weights)
        return receiver

    def close(self) -> None:
        """The runner stops: abandon an open update, release what every receiver holds."""
        self.weights.settle()
        for receiver in self._receivers.values():
            receiver.close()
