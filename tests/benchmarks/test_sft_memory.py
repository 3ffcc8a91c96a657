"""benchmarks/sft_memory.py runs both losses in fresh processes on a one-layer SmolLM2-shaped
model and prints each one's peak RSS; the two losses agree (the figures docs/benchmarks.md quotes
come from its full-size run)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "sft_memory.py"


def test_both_losses_run_and_agree():
    res = subprocess.run([sys.executable, str(SCRIPT), "--batch", "2", "--tokens", "64", "--layers", "1",
                          "--threads", "1"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    for name in ("full_logits", "sft_loss"):
        assert re.search(rf"{name}\s+peak RSS\s+[0-9.]+ GB", res.stdout), res.stdout
    diff = float(re.search(r"loss difference ([0-9.e+-]+)", res.stdout).group(1))
    assert diff < 1e-5, res.stdout
