"""Run model-written Python in a sandbox.

Every execution is a fresh process (``python -u -I -S``) in a throwaway working directory that is
deleted afterwards, with a scrubbed environment (only ``HOME``/``TMPDIR`` = the scratch dir,
``LANG``, ``PYTHONDONTWRITEBYTECODE``), stdin closed, stdout+stderr captured through one pipe read
up to ``max_output_bytes`` (the process is killed past it; ``separate_stderr``: two pipes, the cap
on their sum), and a wall-clock timeout after which the whole process tree is killed. Numeric
libraries get one thread (``OPENBLAS_NUM_THREADS`` / ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``
= 1): threads count against the process limit. A small launcher sets these rlimits before the model's code
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

Modules: ``config`` (:class:`SandboxConfig`, :class:`SandboxResult`, the preamble), ``launcher``
(the in-sandbox cell runner: rlimits, uid drop, cells), ``uids`` (node-wide uid locks and
per-uid process sweeps), ``backends`` (bwrap / unshare command lines, interpreter paths),
``limits`` (scratch-dir measurement, reaping, killing, kill reasons), ``runner``
(:class:`PythonSandbox`: backend selection and one execution).
"""
from __future__ import annotations

import shutil  # noqa: F401 - tests patch ``sandbox.shutil.which`` (the shared module object)

from .backends import _bwrap_cmd, _python, _python_prefix, _site_dirs, _unshare_prefix  # noqa: F401
from .config import _PREIMPORT, DEFAULT_PREAMBLE, SandboxConfig, SandboxResult  # noqa: F401
from .launcher import _LAUNCHER  # noqa: F401
from .limits import _dir_bytes, _kill_proc, _kill_reason, _wait_proc  # noqa: F401
from .runner import _DEFAULT, _PROBE_LOCK, _PROBED, PythonSandbox, available_backends, logger, run_python  # noqa: F401
from .uids import (  # noqa: F401
    _UIDS,
    _count_uid_processes,
    _is_root,
    _kill_uid,
    _lock_dir,
    _proc_uid,
    _UidPool,
)

__all__ = ["SandboxConfig", "SandboxResult", "PythonSandbox", "available_backends", "run_python"]
