"""The runner's side of a streamed weight sync: apply every bucket, then (only if all arrived)
the new version (docs/design.md "Weight streaming")."""
from __future__ import annotations

import logging
from typing import Any

from .object_store import WeightManifest, iter_manifest_tensors, manifest_complete

__all__ = ["apply_manifest", "receive_broadcast"]

logger = logging.getLogger(__name__)


def apply_manifest(engine: Any, manifest: WeightManifest, fetch=None) -> bool:
    """Stream ``manifest``'s buckets into ``engine`` (``load_weights_stream``: one bucket held at
    a time). Returns True and sets ``engine.version`` when every bucket was applied; otherwise
    (a missing ref) leaves the version alone, so that the runner reports its old version and the
    driver's version check fails the step. ``fetch``: ``ray.get`` unless given."""
    applied: list[int] = []
    engine.load_weights_stream(iter_manifest_tensors(manifest, applied, fetch))
    if not manifest_complete(manifest, applied):
        logger.error("weight sync %d: applied buckets %s of %d; keeping version %s",
                     manifest.version, applied, manifest.num_buckets, getattr(engine, "version", None))
        return False
    engine.version = int(manifest.version)
    return True


def receive_broadcast(engine: Any, group: Any) -> tuple[bool, int]:
    """Receive one broadcast sync (transport "collective") into ``engine``, bucket by bucket.
    Returns (complete, version): complete when the end header came and every bucket it counts
    was applied, in order; only then is ``engine.version`` set."""
    from .collective import iter_received

    applied: list[int] = []
    end: dict = {}
    stream = iter_received(group, applied, end)
    try:
        engine.load_weights_stream(stream)
    finally:
        for _ in stream:  # keep in step with the sender even if the loader stopped early
            pass
    version = int(end.get("version", -1))
    complete = bool(end) and applied == list(range(int(end["num_buckets"])))
    if not complete:
        logger.error("weight broadcast %s: applied buckets %s of %s; keeping version %s",
                     version, applied, end.get("num_buckets"), getattr(engine, "version", None))
        return False, version
    engine.version = version
    return True, version
