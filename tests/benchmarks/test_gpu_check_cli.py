"""benchmarks/gpu_check.py parses its options without a GPU (the GPU steps run elsewhere)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_help_lists_the_tp_runner_step():
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--help"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "--tp-runner-only" in res.stdout and "--tp-size" in res.stdout and "--sharded-only" in res.stdout
