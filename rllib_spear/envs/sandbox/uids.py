"""Node-wide sandbox uids: one ``flock``ed lock file per uid (held for an execution), and the
per-uid process count and sweep used to clean up after it."""
from __future__ import annotations

import fcntl
import os
import random
import signal
import subprocess
import tempfile
import threading
import time

__all__: list[str] = []

def _lock_dir() -> str:
    """Node-wide directory of uid lock files, private to the caller's euid (root: under /run)."""
    d = os.environ.get("RLLIB_SPEAR_SANDBOX_LOCK_DIR") or (
        "/run/rllib_spear_sandbox_uids" if _is_root() and os.access("/run", os.W_OK)
        else os.path.join(tempfile.gettempdir(), f"rllib_spear_sandbox_uids_{os.geteuid()}"))
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(d)
    import stat as _stat
    if not _stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise RuntimeError(f"sandbox uid lock dir {d} is not a private directory of uid {os.geteuid()}")
    return d


class _UidPool:
    """Node-wide uid allocation: uid N is held by an exclusive ``flock`` on ``<lock dir>/N.lock``
    for the whole execution, so no two concurrent executions in any processes on this node share
    a uid (hence ``RLIMIT_NPROC`` and the leftover-process sweep are per execution). The kernel
    drops the lock when its holder dies, so a crashed runner never leaks a uid."""

    def __init__(self):
        self._lock = threading.Lock()
        self._next = random.randrange(1 << 30)  # spread the processes' starting points

    def acquire(self, base: int, count: int) -> tuple[int, int]:
        d = _lock_dir()
        with self._lock:
            start = self._next
            self._next += 1
        for k in range(count):
            uid = base + (start + k) % count
            fd = os.open(os.path.join(d, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            return uid, fd
        raise RuntimeError("sandbox uid pool exhausted")

    @staticmethod
    def release(fd: int) -> None:
        os.close(fd)


_UIDS = _UidPool()


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _proc_uid(pid: str) -> int | None:
    """Real uid of a live (non-zombie) process from /proc/<pid>/status (the /proc dir owner is
    root for processes that changed uid, so stat() cannot be used); None for zombies."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"State:") and b"Z" in line.split()[1]:
                    return None
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _count_uid_processes(uid: int) -> int:
    return sum(1 for d in os.listdir("/proc") if d.isdigit() and _proc_uid(d) == uid)


def _kill_uid(uid: int, python: str) -> None:
    """Kill every process of ``uid`` (root only; after process/unshare runs): a helper switches to
    ``uid`` and sends SIGKILL to -1, i.e. to every process of that uid at once (a fork bomb cannot
    outrun it), then a /proc sweep catches stragglers."""
    helper = ("import os, signal\n"
              f"os.setgroups([]); os.setgid({uid}); os.setuid({uid})\n"
              "for _ in range(3):\n    try:\n        os.kill(-1, signal.SIGKILL)\n    except OSError:\n        pass\n")
    try:
        subprocess.run([python, "-I", "-S", "-c", helper], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=10, env={}, close_fds=True)
    except (OSError, subprocess.SubprocessError):
        pass
    for _ in range(20):
        pids = [d for d in os.listdir("/proc") if d.isdigit() and _proc_uid(d) == uid]
        if not pids:
            return
        for d in pids:
            try:
                os.kill(int(d), signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)
