"""benchmarks/learner_throughput.py runs end to end on a tiny model with every optional row
(``--mixed-precision``, ``--packed`` with two kernels) and prints a finite figure for each: the
script docs/benchmarks.md quotes for the learner's tokens/s stays runnable."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "learner_throughput.py"


def test_every_row_is_printed_with_a_finite_rate():
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--threads", "1",
         "--trajs", "8", "--tokens", "48", "--iters", "1", "--spread", "0.5", "--budget", "256",
         "--mixed-precision", "bf16,auto", "--packed", "--packed-attention", "sdpa,sdpa_varlen"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    out = res.stdout
    rate = r"\s+([0-9.]+) tokens/s"
    for row in ("bare torch loop", "GRPOTorchLearner", "learner, mixed_precision=bf16",
                "learner, mixed_precision=auto", "learner, packed sdpa ", "learner, packed sdpa_varlen"):
        m = re.search(re.escape(row) + r"[^:]*:" + rate, out)
        assert m and float(m.group(1)) > 0, (row, out)
    assert re.search(r"mixed_precision=bf16 .*/ float32 learner [0-9.]+x", out), out
    assert re.search(r"padded micro-batches carry \d+ tokens for \d+ real ones", out), out
