"""The README's custom-environment snippet, run as written: its reward over the iterations it trains.

A new user's first hour: copy the README's "Your own environment, tools and rewards" snippet
(a ``FunctionToolEnv`` of one's own on ``model_path: "smollm2-tools"``, on CPU) and run it. This
script takes the snippet from README.md (the first ```python block that builds a
``FunctionToolEnv`` and calls ``algo.train()``; ``--snippet FILE`` reads it from a Markdown or
Python file instead), runs it unchanged in a fresh Python process in an empty folder, and prints
the reward, tool-call rate and filtered share of every iteration from the snippet's own summary
lines (``.debugging(print_summary=True)``: ``iter   1 | reward ... | tool_rate ... |
filtered ...``), the wall time of the run and whether the cold start had to be built first.

    python benchmarks/custom_env_first_hour.py [--snippet FILE] [--timeout 7200]
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_FIGURES = ("reward", "success", "tool_rate", "filtered")


def snippet_from(text: str) -> str:
    """The first ```python block of ``text`` that builds a ``FunctionToolEnv`` and trains (the
    whole text when it holds no block: a Python file)."""
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    if not blocks:
        return text
    for block in blocks:
        if "FunctionToolEnv" in block and "algo.train()" in block:
            return block
    raise ValueError("no ```python block with FunctionToolEnv and algo.train() found")


def iteration_figures(stdout: str) -> list[dict[str, float]]:
    """The figures of every summary line (``progress_line``) in ``stdout``, in order."""
    rows = []
    for line in stdout.splitlines():
        m = re.match(r"iter\s+(\d+) \| (.*)", line.strip())
        if not m:
            continue
        row = {"iteration": float(m.group(1))}
        for part in m.group(2).split(" | "):
            name, _, value = part.partition(" ")
            if name in _FIGURES or name == "time":
                try:
                    row[name] = float(value.rstrip("s"))
                except ValueError:
                    pass
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--snippet", default=str(REPO / "README.md"), help="a Markdown or Python file holding it")
    ap.add_argument("--timeout", type=float, default=7200.0, help="seconds for the whole run (build included)")
    args = ap.parse_args()
    code = snippet_from(Path(args.snippet).read_text())
    cached = None
    if '"smollm2-tools"' in code:
        from rllib_spear.coldstart.build import _pointer, _root
        from rllib_spear.coldstart.smollm2_tools import SMOLLM2_TOOLS_NAME, smollm2_tools_key

        cached = _pointer(_root(None), SMOLLM2_TOOLS_NAME, smollm2_tools_key()) is not None
    print(f"snippet from {args.snippet} ({len(code.splitlines())} lines); smollm2-tools cached before the run: "
          f"{cached}", flush=True)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    t0 = time.time()
    with tempfile.TemporaryDirectory() as empty:
        out = subprocess.run([sys.executable, "-c", code], cwd=empty, env=env, capture_output=True, text=True,
                             timeout=args.timeout)
    wall = time.time() - t0
    if out.returncode != 0:
        sys.exit(f"the snippet failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    rows = iteration_figures(out.stdout)
    if not rows:
        sys.exit(f"no summary line (iter N | ...) in the snippet's output:\n{out.stdout[-3000:]}")
    print(f"{'iteration':>9} " + " ".join(f"{k:>9}" for k in (*_FIGURES, "time_s")))
    for r in rows:
        print(f"{int(r['iteration']):>9} " + " ".join(f"{r.get(k, float('nan')):9.3f}" for k in _FIGURES)
              + f" {r.get('time', float('nan')):9.1f}")
    rewards = [r.get("reward", float("nan")) for r in rows]
    print(f"reward per iteration: {' '.join(f'{x:.3f}' for x in rewards)}; wall time {wall:.0f} s "
          f"(cold start {'cached' if cached else 'built in this run' if cached is False else 'n/a'})")


if __name__ == "__main__":
    main()
