"""The OpenAI endpoint over vLLM's async engine: ``vllm_endpoint_suite.py`` in a pytest process
of its own (vLLM keeps its parallel state per process, as tests/engines/test_vllm_async.py does)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm


def test_vllm_endpoint_suite_in_its_own_process():
    pytest.importorskip("vllm")
    pytest.importorskip("openai")
    here = Path(__file__).resolve().parent
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                           str(here / "vllm_endpoint_suite.py")], cwd=here.parents[1], env=env,
                          capture_output=True, text=True, timeout=1500)
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    if proc.returncode == 5 or " skipped" in proc.stdout and " passed" not in proc.stdout:
        pytest.skip("the vLLM endpoint suite skipped: " + tail[-500:])
    assert proc.returncode == 0, tail
