"""The gate between an engine's generation and its weight updates (fully async training).

With ``rollout_pipeline="async"`` a runner keeps sampling while the driver syncs new weights into
its engine (docs/design.md "Fully asynchronous training"). An engine whose requests run as
batches of ``generate`` (the HF engine, and vLLM without its async engine: the default
``agenerate`` of engines/batching.py) must never load weights while a batch decodes, or the batch
would mix half-loaded layers. The gate orders the two:

- a batch runs inside :meth:`WeightUpdateGate.generating`, which waits while an update is open;
- an update opens with :meth:`begin` (new batches wait; it returns once the running batch, if
  any, finished: a drain at turn boundaries) and closes with :meth:`end`.

A batch reads the engine's ``version`` inside the gate, so every assistant segment of such an
engine is sampled by one version, the one it records.
vLLM's async engine (``VLLMEngine(async_engine=True)``) freezes its running requests for an
update instead (``pause_generation(mode="keep")``) and resumes them on the new weights; its
requests record the version they started with (the oldest of their tokens), so the lag counted
from them is never understated. The runner (env_runners/llm_env_runner.py) opens and closes the
gate around every weight transport; with nothing sampling in the background it never waits.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

__all__ = ["WeightUpdateGate"]


class WeightUpdateGate:
    """Batches and weight updates exclude each other."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0  # batches decoding now
        self._updating = False
        #: seconds updates waited for running batches to finish, and batches for updates
        self.update_wait_s = 0.0
        self.generate_wait_s = 0.0

    @property
    def updating(self) -> bool:
        return self._updating

    @contextmanager
    def generating(self) -> Iterator[None]:
        """Run a batch: waits while an update is open."""
        with self._cond:
            if self._updating:
                t0 = time.perf_counter()
                self._cond.wait_for(lambda: not self._updating)
                self.generate_wait_s += time.perf_counter() - t0
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()

    def begin(self) -> None:
        """Open an update: no new batch starts; returns once the running ones finished. Opening
        an open update does nothing (a sync retried after a failure)."""
        with self._cond:
            if self._updating:
                return
            self._updating = True
            if self._running:
                t0 = time.perf_counter()
                self._cond.wait_for(lambda: self._running == 0)
                self.update_wait_s += time.perf_counter() - t0

    def end(self) -> None:
        """Close the update (or an aborted one): batches resume (closing a closed gate does
        nothing)."""
        with self._cond:
            self._updating = False
            self._cond.notify_all()
