"""The driver's side of the weight sync: learners -> every runner, version-checked
(docs/design.md "One training iteration", "Weight streaming").

RLlib's ``sync_weights`` is fire-and-forget with a cap on requests in flight, so a sync can be
silently dropped; here each runner applies the weights (torch tensors, never RLlib's
float32-numpy conversion) before the call returns and reports the version it then holds. A
runner that reports another version (e.g. it missed a bucket) fails the step loudly.

:class:`WeightSync` (the algorithm holds one) runs the configured transport, or ``"auto"``'s
list, by one rule:

* a named transport that cannot run for the placement (``Transport.unavailable``) fails the
  sync when it is ``strict``; a lenient one hands its syncs to its ``fallback``, said once;
* a sync through it that raises goes through its ``fallback`` (said each time), unless it has
  none, or it is strict and was not ``ready`` (it could not set itself up: a group never
  formed): then the error is the sync's;
* ``"auto"`` takes the first of ``registry.AUTO`` that can run here; one that raises hands the
  sync to the next (one without a fallback fails the sync), and one that could not set itself up
  is not tried again.
"""
from __future__ import annotations

import logging
from typing import Any

from .registry import AUTO, AUTO_NAME, get_transport
from .selection import GLOO_BACKEND
from .transport import Placement, SyncSettings, Transport

__all__ = ["WeightSync", "check_versions"]

logger = logging.getLogger(__name__)


def check_versions(versions: list[int], expected: int) -> int:
    """``expected`` when every runner reports it; else a RuntimeError naming the versions."""
    if any(v != expected for v in versions):
        raise RuntimeError(f"weight sync: runners report versions {versions}, expected {expected}")
    return expected


class WeightSync:
    """Pushes the learners' weights to every runner through ``transport`` (a registered name or
    ``"auto"``) and returns the version every runner then holds. Holds one instance of each
    transport it has used (their groups and caches) for one learner group and runner group.
    ``bucket_mb``: the size bound of a bucket; ``sharding``: the learners' layout;
    ``transfer_backend``: vLLM's weight-transfer backend (transport "vllm")."""

    def __init__(self, transport: str = "object_store", *, bucket_mb: float = 256, sharding: str = "ddp",
                 transfer_backend: str = GLOO_BACKEND) -> None:
        if transport != AUTO_NAME:
            get_transport(transport)  # an unknown name fails here, naming the choices
        self.transport = transport
        self.settings = SyncSettings(bucket_bytes=max(1, int(bucket_mb * 2**20)), sharding=sharding,
                                     transfer_backend=transfer_backend)
        self._transports: dict[str, Transport] = {}
        self._placement: Placement | None = None
        self._retired: set[str] = set()  # "auto": transports that could not set themselves up
        self._said_unavailable: set[str] = set()

    @classmethod
    def from_config(cls, config: Any) -> "WeightSync":
        """The weight sync of an algorithm config (``learners(weight_sync_transport=...,
        weight_sync_bucket_mb=..., weight_transfer_backend=...)``)."""
        from .selection import resolve_transfer_backend, resolve_transport

        return cls(resolve_transport(config.weight_sync_transport, config.engine),
                   bucket_mb=config.weight_sync_bucket_mb, sharding=config.sharding,
                   transfer_backend=resolve_transfer_backend(config.weight_transfer_backend,
                                                             learner_gpus=config.num_gpus_per_learner or 0,
                                                             colocate=bool(getattr(config, "colocate", False))))

    def __call__(self, learner_group: Any, env_runner_group: Any) -> int:
        """One version-checked sync; returns the version every runner holds."""
        placement = self._placement
        if placement is None or placement.env_runner_group is not env_runner_group \
                or placement.learner_group is not learner_group:
            placement = self._placement = Placement(learner_group, env_runner_group)
        if self.transport == AUTO_NAME:
            return self._auto(placement)
        return self._through(self.transport, placement)

    def instance(self, name: str) -> Transport:
        """This sync's instance of transport ``name`` (made on first use)."""
        transport = self._transports.get(name)
        if transport is None:
            transport = self._transports[name] = get_transport(name)(self.settings)
        return transport

    def _through(self, name: str, placement: Placement) -> int:
        transport = self.instance(name)
        why = transport.unavailable(placement)
        if why:
            if transport.strict or transport.fallback is None:
                raise ValueError(f"weight_sync_transport={name!r} cannot run: {why}; use 'auto' or 'object_store'")
            if name not in self._said_unavailable:
                self._said_unavailable.add(name)
                logger.warning("weight_sync_transport=%r cannot run here (%s); using %r", name, why,
                               transport.fallback)
            return self._through(transport.fallback, placement)
        ready = transport.ready
        try:
            versions, expected = transport.sync(placement)
        except Exception as e:
            if transport.fallback is None or (transport.strict and not ready):
                raise
            # e.g. a runner died mid-sync: this sync goes through the fallback (every runner's
            # version still checked), the next one sets the transport up again
            logger.warning("weight sync: transport %r failed (%s: %s); this sync uses %r", name, type(e).__name__,
                           e, transport.fallback)
            return self._through(transport.fallback, placement)
        return check_versions(versions, expected)

    def _auto(self, placement: Placement) -> int:
        for name in AUTO:
            transport = self.instance(name)
            if name in self._retired or transport.unavailable(placement):
                continue
            ready = transport.ready
            try:
                versions, expected = transport.sync(placement)
            except Exception as e:
                if transport.fallback is None:
                    raise
                if not ready:
                    self._retired.add(name)
                    logger.warning("weight_sync_transport='auto': %r could not be set up (%s: %s); not trying it "
                                   "again", name, type(e).__name__, e)
                else:
                    logger.warning("weight sync: transport %r failed (%s: %s); this sync uses the next of %s", name,
                                   type(e).__name__, e, AUTO)
                continue
            return check_versions(versions, expected)
        raise RuntimeError(f"weight_sync_transport='auto': none of {AUTO} could run")
