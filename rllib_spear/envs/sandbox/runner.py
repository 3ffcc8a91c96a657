"""The sandbox runner: :class:`PythonSandbox` (backend selection with probes, one execution:
scratch dir, uid, launcher command, output capture under the limits) and the helpers
:func:`available_backends` and :func:`run_python`."""
from __future__ import annotations

import json
import logging
import os
import select
import shutil
import subprocess
import tempfile
import threading
import time
import warnings
from dataclasses import replace

from .backends import _bwrap_cmd, _python, _python_prefix, _site_dirs, _unshare_prefix
from .config import SandboxConfig, SandboxResult
from .launcher import _LAUNCHER
from .limits import _dir_bytes, _kill_proc, _kill_reason, _wait_proc
from .uids import _UIDS, _count_uid_processes, _is_root, _kill_uid

logger = logging.getLogger("rllib_spear.envs.sandbox")

__all__ = ["PythonSandbox", "available_backends", "run_python"]

_PROBE_LOCK = threading.Lock()
_PROBED: dict[tuple, bool] = {}


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
                "script_tracebacks": bool(cfg.script_tracebacks),
                "limits": {"cpu": int(max(1, cfg.cpu_time_s)), "as": int(cfg.memory_mb) << 20,
                           "nproc": int(nproc), "fsize": int(cfg.max_file_mb) << 20,
                           "nofile": int(cfg.max_open_files)},
            }
            # script_tracebacks: no caret lines under tracebacks (Python >= 3.11 adds them; the
            # 3.10 look, which SandboxFusion's runtime prints; older Pythons ignore the option)
            xopts = ["-X", "no_debug_ranges"] if cfg.script_tracebacks else []
            argv = [py, "-u", "-I", "-S", *xopts, "-c", _LAUNCHER, json.dumps(lcfg)]
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
                                stderr=subprocess.PIPE if cfg.separate_stderr else subprocess.STDOUT,
                                env=env, cwd=workdir, close_fds=True, pass_fds=(status_w,),
                                start_new_session=True)
        # one buffer per pipe (stdout, and stderr when kept apart); the output cap is on their sum
        bufs = {p.fileno(): bytearray() for p in (proc.stdout, proc.stderr) if p is not None}
        open_fds = list(bufs)
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
                r, _, _ = select.select(open_fds, [], [], min(left, 0.05 if measure else 0.25))
                for fd in r:
                    chunk = os.read(fd, 1 << 16)
                    if not chunk:
                        open_fds.remove(fd)
                        continue
                    room = cfg.max_output_bytes - sum(len(b) for b in bufs.values())
                    if len(chunk) > room:
                        bufs[fd] += chunk[: max(room, 0)]
                        truncated = True
                        break
                    bufs[fd] += chunk
                if truncated or not open_fds:
                    break
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
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
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
        err = _kill_reason(cfg, over_quota=over_quota, status=status, timed_out=timed_out, truncated=truncated,
                           rc=rc, cpu=cpu)
        texts = [bytes(b).decode("utf-8", "replace") for b in bufs.values()]
        return SandboxResult(texts[0], rc, timed_out, truncated, err, backend, time.monotonic() - t0,
                             stderr=texts[1] if len(texts) > 1 else "")

    _wait = staticmethod(_wait_proc)
    _kill = staticmethod(_kill_proc)


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
