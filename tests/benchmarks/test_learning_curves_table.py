"""The learning benchmark's summary numbers (final value, iterations to reach a target, the
issue's must-show checks) on hand-made curves."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import learning_curves as lc  # noqa: E402


def _runs(curves: dict[str, list[list[float]]]) -> pd.DataFrame:
    rows = []
    for variant, per_seed in curves.items():
        for seed, values in enumerate(per_seed):
            for it, v in enumerate(values, start=1):
                rows.append({"variant": variant, "algorithm": variant, "env": "search_qa", "seed": seed,
                             "iteration": it, "success": v})
    return pd.DataFrame(rows)


def test_final_value_is_the_mean_of_the_last_iterations_then_over_seeds():
    df = _runs({"A": [[0.0, 0.1, 0.2, 0.3], [0.0, 0.0, 0.4, 0.6]]})
    mean, std, per_seed = lc.final_value(df, "A", "success", last=2)
    assert per_seed == [0.25, 0.5]
    assert np.isclose(mean, 0.375) and np.isclose(std, 0.125)


def test_iterations_to_reach_uses_a_trailing_mean():
    # trailing 2-mean of seed 0: 0, .05, .15, .25 -> reaches .15 at iteration 3; seed 1 at 3 (0, 0, .2)
    df = _runs({"A": [[0.0, 0.1, 0.2, 0.3], [0.0, 0.0, 0.4, 0.6]]})
    assert lc.iterations_to_reach(df, "A", "success", 0.15, window=2) == (3.0, 2, 2)
    mean, reached, seeds = lc.iterations_to_reach(df, "A", "success", 0.9, window=2)
    assert np.isnan(mean) and (reached, seeds) == (0, 2)
    # seed 0 never reaches .4 (trailing 2-mean .25 at most): it counts as iteration 4, a lower bound
    assert lc.iterations_to_reach(df, "A", "success", 0.4, window=2) == (4.0, 1, 2)
    assert lc._reach_text(4.0, 1, 2) == ">= 4.0 (1/2)"


def test_must_show_checks_report_pass_and_fail():
    flat = [0.05] * 20
    rising = [0.05] * 5 + [0.3] * 15
    df = _runs({"GRPO": [flat] * 3, "DrBoT": [[0.06] * 20] * 3, "SPEAR": [rising] * 3})
    target = lc.final_value(df, "DrBoT", "success", 10)[0]
    checks = lc.must_show_checks(df, target, 10)
    assert checks[0].startswith("SPEAR final 0.300 vs Dr.BoT 0.060: +24.0 points (PASS)")
    # SPEAR reaches 0.06 (trailing 3-mean) at iteration 6, Dr.BoT at 1: ratio 6 -> FAIL
    assert "SPEAR 6.0 (3/3), Dr.BoT 1.0 (3/3), ratio 6.00 (FAIL)" in checks[1]
    assert checks[2] == "Dr.BoT final 0.060 vs GRPO 0.050 (PASS)"
    assert checks[3].endswith("(PASS)")
    one_seed = lc.must_show_checks(df[df.seed == 0], target, 10)
    assert one_seed[3] == "seeds per method: DrBoT 1, GRPO 1, SPEAR 1 (FAIL: fewer than 3)"


def test_reach_ratio_counts_a_baseline_seed_that_never_reaches_as_the_run_length():
    late = [0.0] * 10 + [0.3] * 10  # trailing 3-mean reaches .2 at iteration 12
    never = [0.0] * 20
    fast = [0.0] * 2 + [0.3] * 18  # at iteration 4
    df = _runs({"DrBoT": [late, late, never], "SPEAR": [fast, fast, fast]})
    checks = lc.must_show_checks(df, 0.2, 10)
    # Dr.BoT: (12 + 12 + 20) / 3 = 14.67 (a lower bound), SPEAR 4: ratio 0.27
    assert "SPEAR 4.0 (3/3), Dr.BoT >= 14.7 (2/3), ratio 0.27 (PASS)" in checks[1]
    # a SPEAR seed that never reaches makes its mean a lower bound: (4 + 4 + 20) / 3 vs 18
    later = [0.0] * 16 + [0.3] * 4
    df = _runs({"DrBoT": [later] * 3, "SPEAR": [fast, fast, never]})
    assert "SPEAR >= 9.3 (2/3), Dr.BoT 18.0 (3/3), ratio 0.52 (UNDETERMINED)" in lc.must_show_checks(df, 0.2, 10)[1]


def test_multi_answer_table_reports_final_f1_recall_and_searches():
    rows = []
    for variant, seeds in {"GRPO-multi": [(0.1, 0.2, 1.0), (0.3, 0.4, 2.0)], "SPADER": [(0.2, 0.5, 2.0)]}.items():
        for seed, (f1, recall, calls) in enumerate(seeds):
            for it in range(1, 5):
                rows.append({"variant": variant, "env": "multi_answer_search", "seed": seed, "iteration": it,
                             "f1": f1 if it > 2 else 0.0, "recall": recall, "precision": 1.0, "tool_calls": calls})
    rows.append({"variant": "SPEAR", "env": "search_qa", "seed": 0, "iteration": 1, "success": 0.5})
    table = lc.multi_answer_table(pd.DataFrame(rows), window=2)
    assert table[0] == "| variant | seeds | f1 | recall | precision | tool_calls |"
    assert table[2] == "| GRPO-multi | 0,1 | 0.200 +- 0.100 | 0.300 +- 0.100 | 1.000 +- 0.000 | 1.500 +- 0.500 |"
    assert table[3].startswith("| SPADER | 0 | 0.200 +- 0.000 | 0.500 +- 0.000 |")
    assert len(table) == 4  # the search_qa run is not in it
    assert lc.multi_answer_table(pd.DataFrame(rows[-1:]), window=2) == []


def _game_runs(curves: dict[str, list[list[float]]]) -> pd.DataFrame:
    df = _runs(curves)
    df["env"] = "text_game"
    return df


def test_text_game_comparisons_follow_the_papers_order():
    df = _game_runs({"GRPO-game": [[0.1] * 4] * 3, "GiGPO-game": [[0.2] * 4] * 3,
                     "SPEAR-GiGPO-game": [[0.15] * 4] * 3})
    assert lc.text_game_comparisons(df, 2) == [
        "GiGPO-game final 0.200 vs GRPO-game 0.100: +10.0 points (held)",
        "SPEAR-GiGPO-game final 0.150 vs GiGPO-game 0.200: -5.0 points (not held)",
        "SPEAR-GiGPO-game final 0.150 vs GRPO-game 0.100: +5.0 points (held)",
        "seeds per method: GRPO-game 3, GiGPO-game 3, SPEAR-GiGPO-game 3 (PASS)",
    ]
    assert lc.text_game_comparisons(_runs({"GRPO": [[0.1] * 4]}), 2) == []


def test_reach_targets_are_per_task_baselines():
    df = pd.concat([_runs({"DrBoT": [[0.2] * 4]}), _game_runs({"GRPO-game": [[0.4] * 4]})])
    assert lc.reach_targets(df, 2) == {"search_qa": 0.2, "text_game": 0.4}
    assert lc._reach_header({"text_game"}) == "iterations to reach GRPO's final (seeds that do)"
    assert lc._reach_header({"search_qa"}) == "iterations to reach Dr.BoT's final (seeds that do)"


def test_text_game_suite_variants_and_budgets():
    # the agent tree's form (docs/algorithms.md 1.1, 2.2): statistics over step rows, SIL admits steps
    assert lc.TEXT_GAME["GRPO-game"] == ("GRPO-LLM", {"group_stats_over": "steps"})
    assert lc.TEXT_GAME["GiGPO-game"] == ("GRPO-LLM", {"advantage_estimator": "gigpo", "group_stats_over": "steps"})
    assert lc.TEXT_GAME["SPEAR-GiGPO-game"] == ("SPEAR", {"advantage_estimator": "gigpo", "group_stats_over": "steps",
                                                          "sil_admission": "step"})
    max_model_len, response, per_turn = lc.token_budgets("text_game", lc.TEXT_GAME_MAX_TURNS)
    assert max_model_len <= 2048 and response + 256 == max_model_len and per_turn == 64  # embedded positions
    assert lc.token_budgets("search_qa", 3) == (768, 384, 48)


def test_text_game_runs_one_sample_per_step_by_default():
    """--game-layout window (the default): the released per-step sample with 2 steps of history,
    prompt + action within the embedded model's 2048 positions."""
    import argparse

    args = argparse.Namespace(max_turns=None, group_size=2, tasks=2, lr=3e-4, iterations=5, sil_capacity=8, cpus=2,
                              game_model_path="embedded", game_layout="window")
    cfg = lc.build_config("SPEAR", lc.TEXT_GAME["SPEAR-GiGPO-game"][1], "text_game", 0, args)
    assert (cfg.step_context, cfg.history_steps, cfg.max_prompt_tokens) == ("window", 2, 1536)
    assert cfg.max_model_len == 1536 + cfg.max_new_tokens <= 2048
    assert (cfg.group_stats_over, cfg.sil_admission, cfg.advantage_estimator) == ("steps", "step", "gigpo")
    args.game_layout = "full"
    assert lc.build_config("GRPO-LLM", {}, "text_game", 0, args).step_context == "full"


def test_run_order_by_variant_or_by_seed():
    plan = [("A", "GRPO-LLM", {}, "text_game", 2), ("B", "SPEAR", {}, "text_game", 1)]
    assert lc.run_order(plan) == [("A", "GRPO-LLM", {}, "text_game", [0, 1]), ("B", "SPEAR", {}, "text_game", [0])]
    assert [(r[0], r[-1]) for r in lc.run_order(plan, seed_major=True)] == [("A", [0]), ("B", [0]), ("A", [1])]


def test_continue_keeps_the_finished_trials_only():
    import pandas as pd

    df = pd.DataFrame({"variant": ["A", "A", "B", "B", "A"], "seed": [0, 0, 0, 0, 1], "iteration": [1, 2, 1, 2, 1],
                       "success": [0.0] * 5})
    rows, done = lc.finished_trials(df, iterations=2)
    assert done == {("A", 0), ("B", 0)}  # seed 1 of A stopped at iteration 1: run again
    assert [(r["variant"], r["seed"], r["iteration"]) for r in rows] == [("A", 0, 1), ("A", 0, 2), ("B", 0, 1), ("B", 0, 2)]
