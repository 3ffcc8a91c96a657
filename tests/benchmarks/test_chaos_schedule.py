"""benchmarks/chaos.py's bookkeeping (the run itself takes minutes: its output is in docs/benchmarks.md):
the seeded schedule puts every kill once, the runner's first, in distinct iterations strictly
inside the run; the lineage of attempts finds where each restart resumed and which records
count (the last of each iteration)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import chaos  # noqa: E402


@pytest.mark.parametrize("seed", range(6))
def test_schedule_kills_each_once_runner_first(seed):
    sched = chaos.draw_schedule(seed, 10)
    assert sorted(e["kind"] for e in sched) == sorted(chaos.KILLS) and sched[0]["kind"] == "runner"
    its = [e["iteration"] for e in sched]
    assert its == sorted(its) and len(set(its)) == 4 and 2 <= its[0] and its[-1] <= 9
    for e in sched:
        assert (e["moment"] is None) == (e["kind"] == "checkpoint_write")
        assert e["moment"] is None or 0.1 <= e["moment"] <= 0.9
    assert sched == chaos.draw_schedule(seed, 10)


def test_schedule_needs_room_for_the_kills():
    with pytest.raises(SystemExit, match="--iterations"):
        chaos.draw_schedule(0, 5)


def test_lineage_keeps_the_last_record_of_each_iteration():
    attempts = [{"pid": 1, "t": 0, "event": "start"},
                {"pid": 2, "t": 10, "event": "start"}, {"pid": 2, "t": 11, "event": "restored", "algo_step": 2}]
    iterations = [{"pid": 1, "t": 1, "iteration": 1, "w": "a1"}, {"pid": 1, "t": 2, "iteration": 2, "w": "a2"},
                  {"pid": 1, "t": 3, "iteration": 3, "w": "a3"},  # its checkpoint was never written
                  {"pid": 2, "t": 12, "iteration": 3, "w": "b3"}, {"pid": 2, "t": 13, "iteration": 4, "w": "b4"}]
    rows, counted = chaos.lineage(attempts, iterations)
    assert [(r["pid"], r["restored"], r["finished"]) for r in rows] == [(1, 0, [1, 2, 3]), (2, 2, [3, 4])]
    assert [r["w"] for r in counted] == ["a1", "a2", "b3", "b4"]
