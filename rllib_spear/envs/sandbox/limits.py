"""Limits enforced from outside the cell: scratch-dir measurement, reaping with CPU time,
killing the cell's own process group, and the message saying why a cell did not finish."""
from __future__ import annotations

import os
import signal
import subprocess
import time

from .config import SandboxConfig

__all__: list[str] = []

def _dir_bytes(path: str) -> int:
    """Disk use of a directory tree (allocated blocks, symlinks not followed)."""
    total = 0
    stack = [path]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += max(st.st_blocks * 512, 0)
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
        except OSError:
            continue
    return total


def _wait_proc(proc: subprocess.Popen, timeout: float) -> tuple[int | None, float | None]:
    """Reap ``proc`` with wait4 (its CPU time, including reaped descendants, tells a CPU-limit
    kill apart); (None, None) on timeout."""
    end = time.monotonic() + timeout
    while True:
        try:
            pid, sts, ru = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:
            proc.poll()
            return proc.returncode, None
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(sts)
            return proc.returncode, ru.ru_utime + ru.ru_stime
        if time.monotonic() >= end:
            return None, None
        time.sleep(0.005)


def _kill_proc(proc: subprocess.Popen) -> None:
    """Kill the cell's own processes only: its session/process group (bwrap/unshare: the
    monitor, whose death tears down the cell's PID namespace)."""
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            pass
        try:
            proc.kill()
        except OSError:
            pass


def _kill_reason(cfg: SandboxConfig, *, over_quota: bool, status: dict, timed_out: bool, truncated: bool,
                 rc: int | None, cpu: float | None) -> str | None:
    """Why an execution did not finish normally (``SandboxResult.error``), or None; the first
    that applies of: scratch quota, timeout, output cap, a signal (CPU limit named), a failed uid
    drop, a MemoryError."""
    err = None
    qmsg = f"scratch quota of {cfg.scratch_quota_mb:g} MB exceeded"
    if over_quota:
        err = qmsg + "; execution was killed"
    elif status.get("disk_full"):
        err = qmsg
    elif timed_out:
        err = f"timeout: execution exceeded the wall-clock limit of {cfg.wall_timeout_s:g} s and was killed"
    elif truncated:
        err = f"output cap of {cfg.max_output_bytes} bytes (stdout+stderr) exceeded; execution was killed"
    elif rc is not None and rc < 0:
        sig = -rc
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        err = f"killed by signal {name}"
        limit = int(max(1, cfg.cpu_time_s))
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu is not None and cpu >= limit - 0.05):
            err += f" (CPU time limit of {limit} s)"
    elif rc == 97:
        err = "sandbox failure: could not drop privileges"
    elif status.get("memory"):
        err = f"memory limit of {cfg.memory_mb} MB exceeded (MemoryError)"
    return err
