"""The runner's side of a streamed weight sync: apply every bucket, then (only if all arrived,
in order) the new version (docs/design.md "Weight streaming")."""
from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Iterator

import torch

from .buckets import BucketMeta
from .object_store import iter_bucket_tensors

__all__ = ["BucketStream", "receive_broadcast"]

logger = logging.getLogger(__name__)

_END = object()


class BucketStream:
    """One object-store sync into ``engine``, applied while it is still being sent.

    The buckets' (metadata, ref) pairs are :meth:`add`-ed as the driver forwards them; a thread
    runs one ``engine.load_weights_stream`` over them (vLLM needs one reload over the whole
    stream), fetching and applying one bucket at a time. So the runner copies bucket k into its
    engine while the sender writes bucket k+1 into the store. :meth:`finish` waits for the
    thread and sets ``engine.version`` only when buckets 0..n-1 were applied, in order; a gap
    (a bucket that never came) keeps the old version, so the driver's version check fails.
    Calls come from one thread (the runner actor's); the engine must not be used elsewhere until
    :meth:`finish` or :meth:`abort` returned. ``fetch``: ``ray.get`` unless given.
    """

    def __init__(self, engine: Any, version: int, fetch=None):
        self.engine = engine
        self.version = int(version)
        self.applied: list[int] = []
        self._fetch = fetch
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._apply, name=f"weight-stream-v{self.version}", daemon=True)
        self._thread.start()

    def add(self, meta: BucketMeta, ref: Any) -> None:
        """Queue one bucket (its ref, not its data) for the applying thread."""
        if self._closed:
            raise RuntimeError(f"weight stream v{self.version} is already finished")
        self._queue.put((meta, ref))

    def finish(self, num_buckets: int) -> bool:
        """Wait until every queued bucket was applied; True (and the engine's version set) when
        they were buckets 0..num_buckets-1, in order. Re-raises the loader's error."""
        self._close()
        if self._error is not None:
            raise self._error
        if self.applied != list(range(int(num_buckets))):
            logger.error("weight sync %d: applied buckets %s of %d; keeping version %s", self.version,
                         self.applied, num_buckets, getattr(self.engine, "version", None))
            return False
        self.engine.version = self.version
        return True

    def abort(self) -> None:
        """Stop after the buckets queued so far (the version is left alone)."""
        self._close()
        logger.error("weight sync %d: abandoned after buckets %s", self.version, self.applied)

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put(_END)
        self._thread.join()

    def _pairs(self) -> Iterator[tuple[BucketMeta, Any]]:
        while (item := self._queue.get()) is not _END:
            yield item

    def _apply(self) -> None:
        try:
            with torch.no_grad():  # grad mode is per thread
                self.engine.load_weights_stream(iter_bucket_tensors(self._pairs(), self.applied, self._fetch))
        except BaseException as e:  # handed to finish(), on the runner's thread
            self._error = e


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
