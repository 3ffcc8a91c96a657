"""Run model-written Python in a sandbox.

Every execution is a fresh process (``python -u -I -S``) in a throwaway working directory that is
deleted afterwards, with a scrubbed environment (only ``HOME``/``TMPDIR`` = the scratch dir,
``LANG``, ``PYTHONDONTWRITEBYTECODE``), stdin closed, stdout+stderr captured through one pipe read
up to ``max_output_bytes`` (the process is killed past it), and a wall-clock timeout after which
the whole process tree is killed. A small launcher sets these rlimits before the model's code
runs: CPU seconds (``RLIMIT_CPU``), address space (``RLIMIT_AS``), processes
(``RLIMIT_NPROC``), file size (``RLIMIT_FSIZE``, SIGXFSZ ignored so an oversized write fails
with an error), open files, no core dumps. Interpreter state can persist across turns
(``PythonSandbox.run(code, history=...)``): earlier cells are re-executed silently before the new
one, so the sandbox itself stays stateless.

Isolation backends. ``backend="auto"`` uses ``bwrap``; without a working bubblewrap it refuses
to start (``RuntimeError`` naming the fix) unless ``allow_weak_sandbox=True``, then it warns and
uses ``unshare`` or ``process``. The backend in use: ``PythonSandbox.backend`` and
``SandboxResult.backend``. Sandbox uids are allocated node-wide (one ``flock``ed lock file per
uid, held for the execution); cleanup only kills the execution's own session / PID namespace and
stragglers under its exclusively held uid. Disk: ``scratch_quota_mb`` in all (bwrap: a sized
tmpfs at ``/tmp`` with ``/sandbox`` linked to it and ``/dev`` read-only; other backends: the
scratch dir is measured every 50 ms and the cell killed past the quota):

``bwrap`` (bubblewrap, Debian package ``bubblewrap``): new PID, network, IPC, UTS (and cgroup)
    namespaces; a new root filesystem that holds only ``/usr`` (+ the ``/bin``, ``/lib*`` links),
    the Python installation and (optionally) this environment's site-packages, all read-only, a
    fresh ``/proc``, a minimal ``/dev``, an empty tmpfs ``/tmp`` and the scratch dir as
    ``/sandbox`` (the only writable host path). No ``/etc``, ``/home``, ``/root`` contents, repo or
    other host files are visible. Network: only a private loopback. The sandbox cannot see or
    signal host processes (PID namespace); killing the bwrap monitor kills the whole namespace
    (``--die-with-parent``). When the caller is root, bwrap runs privileged (no user namespace)
    with every capability dropped except SETUID/SETGID, and the launcher immediately switches to
    an unprivileged uid/gid from a private pool (61000+, one uid per concurrent execution, so
    ``RLIMIT_NPROC`` is per execution) with no supplementary groups; the model's code therefore
    runs with no capabilities as a non-root user. When the caller is not root, bwrap uses an
    unprivileged user namespace and the code keeps the caller's uid (mapped), and the process
    limit is the caller's current process count + ``max_processes``.
``unshare`` (util-linux, root only): new network, PID (``--kill-child``), IPC and UTS namespaces
    with a fresh ``/proc``; uid drop and rlimits as above. The host filesystem stays visible:
    protection of files then rests on Unix permissions for the unprivileged uid (it can still read
    world-readable files and write world-writable directories such as ``/tmp``).
``process`` (last resort): a plain child process in its own session with the rlimits and, when
    root, the uid drop. No network isolation (any reachable host can be contacted), host files as
    for ``unshare``; leftover processes are killed by session and, when root, by sweeping every
    process of the sandbox uid. If neither root nor namespaces are available the code runs with
    the caller's uid: only the rlimits, the timeout and the scrubbed environment remain.

What no backend limits: CPU share while running (use fewer concurrent executions), memory in
page cache/tmpfs (``/tmp`` inside bwrap is RAM-backed but bounded by ``RLIMIT_FSIZE`` per file),
and kernel attack surface (no seccomp filter).

In the ``process``/``unshare`` backends the interpreter is started as root and drops privileges
after the preamble imports: stdlib modules that are neither pre-imported nor readable by the
unprivileged uid (e.g. a Python under ``/root``) cannot be imported by the model's code there.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["SandboxConfig", "SandboxResult", "PythonSandbox", "available_backends", "run_python"]

DEFAULT_PREAMBLE = (
    "import math, re, string, datetime, collections, heapq, bisect, copy, random, statistics, "
    "itertools, functools, operator, io, json, fractions, decimal\n"
    "from math import *\n"
    "from fractions import Fraction\n"
    "from collections import Counter, defaultdict, deque\n"
)

# Imported by the launcher before it drops privileges (process/unshare backends).
_PREIMPORT = [
    "math", "re", "string", "datetime", "collections", "heapq", "bisect", "copy", "random",
    "statistics", "itertools", "functools", "operator", "io", "json", "fractions", "decimal",
    "traceback", "linecache", "os", "signal", "resource", "typing", "dataclasses", "enum", "time",
    "textwrap", "numbers", "cmath", "array", "struct", "hashlib", "base64", "pprint", "contextlib",
]

_LAUNCHER = r'''
import json, os, resource, signal, sys
cfg = json.loads(sys.argv[1])
for p in cfg["site"]:
    sys.path.append(p)
for m in cfg["preimport"]:
    try:
        __import__(m)
    except Exception:
        pass
import traceback
SFD = cfg["status_fd"]
if SFD is not None:
    try:
        os.set_inheritable(SFD, False)
    except OSError:
        SFD = None
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
L = cfg["limits"]
def lim(r, v):
    try:
        resource.setrlimit(r, (v, v))
    except (ValueError, OSError):
        pass
lim(resource.RLIMIT_CORE, 0)
lim(resource.RLIMIT_NOFILE, L["nofile"])
lim(resource.RLIMIT_FSIZE, L["fsize"])
lim(resource.RLIMIT_NPROC, L["nproc"])
try:
    resource.setrlimit(resource.RLIMIT_CPU, (L["cpu"], L["cpu"] + 1))
except (ValueError, OSError):
    pass
if cfg["uid"] is not None:
    os.setgroups([])
    os.setgid(cfg["uid"])
    os.setuid(cfg["uid"])
    if os.getuid() != cfg["uid"] or os.geteuid() != cfg["uid"] or os.getegid() != cfg["uid"]:
        os._exit(97)
os.umask(0o077)
os.chdir(cfg["cwd"])
with open(cfg["cells"], encoding="utf-8") as f:
    cells = json.load(f)
lim(resource.RLIMIT_AS, L["as"])
g = {"__name__": "__main__", "__builtins__": __builtins__}
def run(src, name):
    exec(compile(src, name, "exec"), g)
rc = 0
status = {}
out, err = sys.stdout, sys.stderr
try:
    run(cfg["preamble"], "<preamble>")
    if cells[:-1]:
        sys.stdout = sys.stderr = open(os.devnull, "w")
        for i, c in enumerate(cells[:-1]):
            try:
                run(c, f"<cell {i}>")
            except BaseException:
                pass
        sys.stdout, sys.stderr = out, err
    run(cells[-1], "<cell>")
except SystemExit as e:
    sys.stdout, sys.stderr = out, err
    rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
except BaseException as e:
    sys.stdout, sys.stderr = out, err
    if isinstance(e, MemoryError):
        status["memory"] = True
    elif isinstance(e, OSError) and e.errno in (28, 122):  # ENOSPC, EDQUOT
        status["disk_full"] = True
    tb = e.__traceback__
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell"):
        tb = tb.tb_next
    try:
        traceback.print_exception(type(e), e, tb, limit=5)
    except BaseException:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
    rc = 1
try:
    sys.stdout.flush(); sys.stderr.flush()
except BaseException:
    pass
if cfg["quota_fs"]:
    try:
        st = os.statvfs(cfg["cwd"])
        if st.f_bavail * st.f_frsize < 256 * 1024:
            status["disk_full"] = True
    except OSError:
        pass
if SFD is not None and status:
    try:
        os.write(SFD, json.dumps(status).encode())
    except OSError:
        pass
os._exit(rc)
'''


@dataclass
class SandboxConfig:
    """Limits and isolation choices for one execution (see the module docstring)."""

    wall_timeout_s: float = 10.0
    cpu_time_s: int = 5
    memory_mb: int = 1024
    max_processes: int = 16
    max_file_mb: int = 16
    max_open_files: int = 64
    max_output_bytes: int = 1 << 20  # output cap: stdout+stderr bytes in all; killed past it
    scratch_quota_mb: int = 64  # total bytes the cell may keep in its writable scratch dir
    backend: str = "auto"  # auto (= bwrap, see allow_weak_sandbox) | bwrap | unshare | process
    allow_weak_sandbox: bool = False  # auto without usable bubblewrap: fall back (warning) instead of refusing
    python: str | None = None  # default: the running interpreter
    site_packages: bool = True  # make this environment's site-packages importable (read-only)
    preamble: str = DEFAULT_PREAMBLE
    preimport: list[str] = field(default_factory=lambda: list(_PREIMPORT))
    uid_base: int = 61000
    uid_count: int = 1024


@dataclass
class SandboxResult:
    output: str
    exit_code: int | None
    timed_out: bool = False
    output_truncated: bool = False
    error: str | None = None  # why it did not finish normally (timeout, output limit, signal, ...)
    backend: str = ""
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.error is None


def _python(cfg: SandboxConfig) -> str:
    return os.path.realpath(cfg.python or sys.executable)


def _python_prefix(py: str) -> str:
    # <prefix>/bin/python3.x -> <prefix>
    return str(Path(py).parent.parent)


def _site_dirs() -> list[str]:
    import site
    import sysconfig

    dirs = []
    for d in [sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib"), *site.getsitepackages()]:
        if d and os.path.isdir(d) and os.path.realpath(d) not in dirs:
            dirs.append(os.path.realpath(d))
    return dirs


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
_PROBE_LOCK = threading.Lock()
_PROBED: dict[tuple, bool] = {}


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


def _bwrap_cmd(py: str, ro_paths: list[str], workdir: str, root: bool, quota_bytes: int) -> list[str]:
    # --as-pid-1: the launcher is the namespace init and bwrap's direct child, so wait4() on bwrap
    # reports its CPU time (kill reasons) and the whole namespace dies when it exits.
    cmd = ["bwrap", "--unshare-pid", "--as-pid-1", "--unshare-net", "--unshare-ipc", "--unshare-uts",
           "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv",
           "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    # /dev read-only (no RAM-backed /dev/shm outside the quota). The only writable place is a
    # size-limited tmpfs at /tmp (the scratch quota), gone with the namespace; /sandbox links to
    # it. It is mounted before the read-only binds, so that an interpreter or site-packages that
    # live under /tmp on the host (a venv in a CI clone under /tmp) are bound on top of it.
    cmd += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
            "--perms", "0777", "--size", str(int(quota_bytes)), "--tmpfs", "/tmp"]
    made = {"/", "/usr", "/tmp", "/sandbox", "/proc", "/dev", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"}
    for p in ro_paths:
        if p.startswith("/usr/") or p == "/usr":
            continue
        parts = Path(p).parts
        for i in range(2, len(parts)):
            anc = str(Path(*parts[:i]))
            if anc not in made:
                cmd += ["--perms", "0755", "--dir", anc]
                made.add(anc)
        cmd += ["--ro-bind", p, p]
        made.add(p)
    cmd += ["--symlink", "/tmp", "/sandbox",
            "--ro-bind", os.path.join(workdir, ".cells.json"), "/.cells.json", "--chdir", "/sandbox",
            "--setenv", "HOME", "/sandbox", "--setenv", "TMPDIR", "/sandbox",
            "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONDONTWRITEBYTECODE", "1"]
    if root:
        cmd += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        cmd += ["--unshare-user"]
    return cmd


def _unshare_prefix() -> list[str]:
    return ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc", "--uts"]


class PythonSandbox:
    """Runs Python cells under :class:`SandboxConfig`. Safe to share between threads."""

    def __init__(self, config: SandboxConfig | None = None, **overrides):
        cfg = config or SandboxConfig()
        self.config = replace(cfg, **overrides) if overrides else cfg
        self.backend = self._select_backend()

    # -- backend selection -------------------------------------------------------------------
    def _probe(self, backend: str) -> bool:
        key = (backend, _python(self.config), self.config.site_packages)
        with _PROBE_LOCK:
            if key not in _PROBED:
                try:
                    res = self._run_once(["print('ok')"], backend, probe=True)
                    _PROBED[key] = res.exit_code == 0 and res.output.strip() == "ok"
                except Exception:  # noqa: BLE001 - an unusable backend is just skipped
                    _PROBED[key] = False
            return _PROBED[key]

    def _select_backend(self) -> str:
        want = self.config.backend
        if want not in ("auto", "bwrap", "unshare", "process"):
            raise ValueError(f"unknown sandbox backend {want!r}")
        if want == "auto":
            if shutil.which("bwrap") and self._probe("bwrap"):
                return "bwrap"
            why = ("bubblewrap (bwrap) is not installed" if not shutil.which("bwrap")
                   else "bubblewrap (bwrap) is installed but does not work here (namespaces disallowed?)")
            if not self.config.allow_weak_sandbox:
                raise RuntimeError(
                    f"refusing to run model-written code: {why}. Fix: install bubblewrap "
                    "(`apt-get install bubblewrap`, or run scripts/install.sh as root), or accept a weaker "
                    "sandbox with allow_weak_sandbox=True in SandboxConfig (env_config "
                    "'sandbox_config': {'allow_weak_sandbox': True}).")
            weak = "unshare" if shutil.which("unshare") and _is_root() and self._probe("unshare") else "process"
            msg = (f"{why}; allow_weak_sandbox=True, so model-written code runs in the weaker "
                   f"{weak!r} sandbox backend (host files visible{'' if weak == 'unshare' else ', network open'})")
            warnings.warn(msg, RuntimeWarning, stacklevel=3)
            logger.warning(msg)
            return weak
        if want == "bwrap" and not shutil.which("bwrap"):
            raise RuntimeError("sandbox backend 'bwrap' needs bubblewrap: apt-get install bubblewrap")
        if want == "unshare" and (not shutil.which("unshare") or not _is_root()):
            raise RuntimeError("sandbox backend 'unshare' needs util-linux unshare and root")
        if want == "process" or self._probe(want):
            return want
        raise RuntimeError(f"sandbox backend {want!r} is not usable on this machine")

    # -- execution ---------------------------------------------------------------------------
    def run(self, code: str, history: list[str] | None = None) -> SandboxResult:
        """Execute ``code`` (after silently re-running ``history`` cells). Never raises for
        anything the code does; a failure of the sandbox itself comes back as ``error``."""
        try:
            return self._run_once([*(history or []), code], self.backend)
        except Exception as e:  # noqa: BLE001 - the environment must never raise
            return SandboxResult("", None, error=f"sandbox failure: {type(e).__name__}: {e}",
                                 backend=self.backend)

    def _run_once(self, cells: list[str], backend: str, probe: bool = False) -> SandboxResult:
        cfg = self.config
        py = _python(cfg)
        root = _is_root()
        uid, lock_fd = _UIDS.acquire(cfg.uid_base, cfg.uid_count) if root else (None, None)
        workdir = None
        status_r = status_w = None
        t0 = time.monotonic()
        try:
            if uid is not None and _count_uid_processes(uid):
                # we hold this uid exclusively node-wide: what still runs under it is an orphan
                # of an execution whose runner crashed (process backend); not anyone's live cell.
                _kill_uid(uid, py)
            workdir = tempfile.mkdtemp(prefix="rllib_spear_sbx_")
            cells_path = os.path.join(workdir, ".cells.json")
            with open(cells_path, "w", encoding="utf-8") as f:
                json.dump([c if isinstance(c, str) else str(c) for c in cells], f)
            if uid is not None:
                # owner: the sandbox uid; others may only traverse (bwrap's capability-less root
                # needs that to chdir into it); the cells file is private to the sandbox uid.
                os.chown(cells_path, uid, uid)
                os.chmod(cells_path, 0o600)
                os.chown(workdir, uid, uid)
                os.chmod(workdir, 0o711)
            status_r, status_w = os.pipe()
            site = _site_dirs() if cfg.site_packages else []
            nproc = cfg.max_processes
            if uid is None:
                nproc += _count_uid_processes(os.getuid())
            inner_cwd = "/sandbox" if backend == "bwrap" else workdir
            lcfg = {
                "uid": uid,
                "cwd": inner_cwd,
                "cells": "/.cells.json" if backend == "bwrap" else cells_path,
                "site": site,
                "status_fd": status_w,
                "quota_fs": backend == "bwrap",
                "preimport": [] if backend == "bwrap" else cfg.preimport,
                "preamble": "" if probe else cfg.preamble,
                "limits": {"cpu": int(max(1, cfg.cpu_time_s)), "as": int(cfg.memory_mb) << 20,
                           "nproc": int(nproc), "fsize": int(cfg.max_file_mb) << 20,
                           "nofile": int(cfg.max_open_files)},
            }
            argv = [py, "-u", "-I", "-S", "-c", _LAUNCHER, json.dumps(lcfg)]
            env = {"HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
                   "PATH": "/usr/bin:/bin"}
            if backend == "bwrap":
                cmd = (_bwrap_cmd(py, [_python_prefix(py), *site], workdir, root, self._quota_bytes())
                       + ["--", *argv])
            elif backend == "unshare":
                cmd = _unshare_prefix() + ["--", *argv]
            else:
                cmd = argv
            return self._communicate(cmd, env, workdir, backend, t0, status_r, status_w)
        finally:
            for fd in (status_r, status_w):
                if fd is not None:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            if uid is not None:
                # The cell's session / PID namespace was killed above. Stragglers (code that
                # escaped the session with setsid, a namespace still being torn down) run under
                # the uid that this execution holds exclusively node-wide, so sweeping that uid
                # only reaches this cell's own processes. Then the uid lock is released.
                if _count_uid_processes(uid):
                    _kill_uid(uid, py)
                _UIDS.release(lock_fd)
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)

    def _quota_bytes(self) -> int:
        return max(1, int(self.config.scratch_quota_mb)) << 20

    def _communicate(self, cmd, env, workdir, backend, t0, status_r, status_w) -> SandboxResult:
        cfg = self.config
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env, cwd=workdir, close_fds=True,
                                pass_fds=(status_w,), start_new_session=True)
        fd = proc.stdout.fileno()
        buf = bytearray()
        timed_out = truncated = over_quota = False
        quota = self._quota_bytes()
        # bwrap: the kernel enforces the quota (tmpfs size); elsewhere we measure the scratch dir
        measure = backend != "bwrap"
        deadline = t0 + cfg.wall_timeout_s
        next_check = 0.0
        cpu = None
        rc = None
        try:
            while True:
                now = time.monotonic()
                left = deadline - now
                if left <= 0:
                    timed_out = True
                    break
                if measure and now >= next_check:
                    next_check = now + 0.05
                    if _dir_bytes(workdir) > quota:
                        over_quota = True
                        break
                r, _, _ = select.select([fd], [], [], min(left, 0.05 if measure else 0.25))
                if not r:
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                room = cfg.max_output_bytes - len(buf)
                if len(chunk) > room:
                    buf += chunk[: max(room, 0)]
                    truncated = True
                    break
                buf += chunk
            if timed_out or truncated or over_quota:
                self._kill(proc)
            rc, cpu = self._wait(proc, max(0.5, deadline - time.monotonic()))
            if rc is None:
                timed_out = True
                self._kill(proc)
                rc, cpu = self._wait(proc, 5)
        finally:
            if proc.returncode is None:
                self._kill(proc)
                self._wait(proc, 5)
            proc.stdout.close()
        status = {}
        try:
            os.set_blocking(status_r, False)
            status = json.loads(os.read(status_r, 1 << 12) or b"{}")
            status = status if isinstance(status, dict) else {}
        except (OSError, ValueError):
            status = {}
        if measure and not over_quota and _dir_bytes(workdir) > quota:
            over_quota = True
        if backend in ("bwrap", "unshare") and rc is not None and 128 < rc < 128 + 65:
            rc = -(rc - 128)  # the namespace helper reports a child killed by signal N as 128+N
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
        return SandboxResult(buf.decode("utf-8", "replace"), rc, timed_out, truncated, err, backend,
                             time.monotonic() - t0)

    @staticmethod
    def _wait(proc: subprocess.Popen, timeout: float) -> tuple[int | None, float | None]:
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

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
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


def available_backends() -> dict[str, bool]:
    """Which backends work here (probed)."""
    out = {}
    for b in ("bwrap", "unshare", "process"):
        try:
            out[b] = PythonSandbox(backend=b).backend == b
        except (RuntimeError, ValueError):
            out[b] = False
    return out


_DEFAULT: dict[tuple, PythonSandbox] = {}


def run_python(code: str, history: list[str] | None = None, **config) -> SandboxResult:
    """Convenience: run ``code`` in a (cached) sandbox built from ``config`` overrides."""
    key = tuple(sorted((k, repr(v)) for k, v in config.items()))
    sb = _DEFAULT.get(key)
    if sb is None:
        sb = _DEFAULT[key] = PythonSandbox(**config)
    return sb.run(code, history)
