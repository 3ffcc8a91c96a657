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

Isolation backends (``backend="auto"`` picks the first that works on this machine, probed once):

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

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

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
    max_output_bytes: int = 1 << 20
    backend: str = "auto"  # auto | bwrap | unshare | process
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


class _UidPool:
    def __init__(self):
        self._lock = threading.Lock()
        self._used: set[int] = set()
        self._next = 0

    def acquire(self, base: int, count: int) -> int:
        with self._lock:
            for k in range(count):
                uid = base + (self._next + k) % count
                if uid not in self._used:
                    self._used.add(uid)
                    self._next = (self._next + k + 1) % count
                    return uid
        raise RuntimeError("sandbox uid pool exhausted")

    def release(self, uid: int) -> None:
        with self._lock:
            self._used.discard(uid)


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


def _bwrap_cmd(py: str, ro_paths: list[str], workdir: str, root: bool) -> list[str]:
    cmd = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
           "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv",
           "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    made = {"/", "/usr", "/tmp", "/proc", "/dev", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"}
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
    cmd += ["--bind", workdir, "/sandbox", "--chdir", "/sandbox",
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
        order = ["bwrap", "unshare", "process"] if want == "auto" else [want]
        for b in order:
            if b not in ("bwrap", "unshare", "process"):
                raise ValueError(f"unknown sandbox backend {b!r}")
            if b == "bwrap" and not shutil.which("bwrap"):
                continue
            if b == "unshare" and (not shutil.which("unshare") or not _is_root()):
                continue
            if b == "process" or self._probe(b):
                return b
        if want != "auto":
            raise RuntimeError(f"sandbox backend {want!r} is not usable on this machine")
        return "process"

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
        uid = _UIDS.acquire(cfg.uid_base, cfg.uid_count) if root else None
        workdir = tempfile.mkdtemp(prefix="rllib_spear_sbx_")
        t0 = time.monotonic()
        res = None
        try:
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
            site = _site_dirs() if cfg.site_packages else []
            nproc = cfg.max_processes
            if uid is None:
                nproc += _count_uid_processes(os.getuid())
            inner_cwd = "/sandbox" if backend == "bwrap" else workdir
            lcfg = {
                "uid": uid,
                "cwd": inner_cwd,
                "cells": os.path.join(inner_cwd, ".cells.json"),
                "site": site,
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
                cmd = _bwrap_cmd(py, [_python_prefix(py), *site], workdir, root) + ["--", *argv]
            elif backend == "unshare":
                cmd = _unshare_prefix() + ["--", *argv]
            else:
                cmd = argv
            res = self._communicate(cmd, env, workdir, backend, t0)
            return res
        finally:
            if uid is not None:
                # bwrap: the PID namespace dies with its init, but killed trees may linger a
                # moment; sweep the uid after abnormal ends. Other backends: always sweep.
                if backend != "bwrap" or res is None or not res.ok:
                    _kill_uid(uid, py)
                _UIDS.release(uid)
            shutil.rmtree(workdir, ignore_errors=True)

    def _communicate(self, cmd, env, workdir, backend, t0) -> SandboxResult:
        cfg = self.config
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env, cwd=workdir, close_fds=True,
                                start_new_session=True)
        fd = proc.stdout.fileno()
        buf = bytearray()
        timed_out = truncated = False
        deadline = t0 + cfg.wall_timeout_s
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                r, _, _ = select.select([fd], [], [], min(left, 0.25))
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
            if timed_out or truncated:
                self._kill(proc)
            try:
                rc = proc.wait(timeout=max(0.5, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                self._kill(proc)
                rc = proc.wait(timeout=5)
        finally:
            if proc.poll() is None:
                self._kill(proc)
                proc.wait(timeout=5)
            proc.stdout.close()
        err = None
        if backend in ("bwrap", "unshare") and rc is not None and 128 < rc < 128 + 65:
            rc = -(rc - 128)  # the namespace helper reports a child killed by signal N as 128+N
        if timed_out:
            err = f"timeout: execution exceeded {cfg.wall_timeout_s:g} s and was killed"
        elif truncated:
            err = f"output limit: more than {cfg.max_output_bytes} bytes of output; execution was killed"
        elif rc is not None and rc < 0:
            sig = -rc
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            extra = " (CPU time limit)" if sig in (signal.SIGXCPU, signal.SIGKILL) else ""
            err = f"killed by signal {name}{extra}"
        elif rc == 97:
            err = "sandbox failure: could not drop privileges"
        return SandboxResult(buf.decode("utf-8", "replace"), rc, timed_out, truncated, err, backend,
                             time.monotonic() - t0)

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
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
