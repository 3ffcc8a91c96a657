"""Isolation backends: the interpreter and site-packages paths a cell needs, and the ``bwrap``
and ``unshare`` command lines (``process`` runs the launcher directly)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from .config import SandboxConfig

__all__: list[str] = []

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
