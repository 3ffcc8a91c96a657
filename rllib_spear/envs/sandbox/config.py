"""Sandbox settings and results: :class:`SandboxConfig`, :class:`SandboxResult` and the default
preamble / pre-imported modules."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SandboxConfig", "SandboxResult", "DEFAULT_PREAMBLE"]

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
    # stdout and stderr through separate pipes (``SandboxResult.stderr``); default: one merged
    # stream in ``output``. A tool whose rules read stderr apart (ReTool's) needs them apart.
    separate_stderr: bool = False
    # Tracebacks as ``python script.py`` prints them on Python 3.10: every frame, the cell's
    # source lines, no caret lines (default: at most 5 frames, no source lines).
    script_tracebacks: bool = False
    uid_base: int = 61000
    uid_count: int = 1024


@dataclass
class SandboxResult:
    output: str  # stdout+stderr merged; stdout only with ``separate_stderr``
    exit_code: int | None
    timed_out: bool = False
    output_truncated: bool = False
    error: str | None = None  # why it did not finish normally (timeout, output limit, signal, ...)
    backend: str = ""
    wall_s: float = 0.0
    stderr: str = ""  # only with ``separate_stderr`` (else merged into ``output``)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.error is None
