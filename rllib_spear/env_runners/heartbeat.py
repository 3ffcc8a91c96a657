"""A heartbeat for a long sampling call: one line every ``every_s`` seconds while it runs.

On CPU one sampling phase of a real model can take minutes with nothing on the console; the env
runner wraps its sampling call in :func:`heartbeat`, which prints from a daemon thread::

    [rllib_spear] sampling (local runner): 12/32 episodes done, 60 s

``progress()`` returns (episodes done, episodes expected); it is read from the heartbeat's thread
(the rollouts expose ``episodes_done()`` for it). A call shorter than ``every_s`` prints nothing.
Remote runners' lines reach the driver's console through Ray's log forwarding. Set the period
with ``.debugging(heartbeat_s=...)`` (None or 0: off).
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

__all__ = ["heartbeat", "heartbeat_line"]


def heartbeat_line(label: str, done: int, expected: int, elapsed_s: float) -> str:
    """``[rllib_spear] sampling (<label>): <done>/<expected> episodes done, <elapsed> s``."""
    return f"[rllib_spear] sampling ({label}): {done}/{expected} episodes done, {elapsed_s:.0f} s"


@contextmanager
def heartbeat(progress: Callable[[], tuple[int, int]], every_s: float | None, label: str,
              emit: Callable[[str], None] | None = None) -> Iterator[None]:
    """Print :func:`heartbeat_line` every ``every_s`` seconds until the block ends (nothing when
    ``every_s`` is None or <= 0). ``emit``: where a line goes (default: ``print`` to stdout)."""
    if not every_s or every_s <= 0:
        yield
        return
    out = emit or (lambda line: print(line, flush=True))
    stop = threading.Event()
    t0 = time.monotonic()

    def beat() -> None:
        while not stop.wait(every_s):
            try:
                done, expected = progress()
            except Exception:  # noqa: BLE001 - a heartbeat never fails the sampling it reports on
                continue
            out(heartbeat_line(label, done, expected, time.monotonic() - t0))

    thread = threading.Thread(target=beat, name="rllib_spear-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=1.0)
