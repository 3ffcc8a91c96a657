"""vLLM's async engine mode (docs/design.md "vLLM async engine"): the suite in
``vllm_async_suite.py``, run in its own pytest process. In process, vLLM keeps its parallel state
per process: an async engine built and dropped beside the session's sync engine
(``conftest.py``) would tear that state down under it, so the suite gets a process of its own."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm


def test_async_engine_suite_in_its_own_process():
    pytest.importorskip("vllm")
    here = Path(__file__).resolve().parent
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                           str(here / "vllm_async_suite.py")], cwd=here.parents[1], env=env,
                          capture_output=True, text=True, timeout=1500)
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    if proc.returncode == 5 or " skipped" in proc.stdout and " passed" not in proc.stdout:
        pytest.skip("the async engine suite skipped: " + tail[-500:])
    assert proc.returncode == 0, tail
