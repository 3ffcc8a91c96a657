"""Evaluation metrics (rllib_spear/metrics.py ``task_metrics``): per-benchmark scores, their
unweighted average, mean@n and unbiased pass@k, with hand-computed values. (That the module
imports no Ray is checked with the recipe layer: tests/recipe/test_recipe.py.)"""
from __future__ import annotations

import pytest

from rllib_spear.core.trajectory import Segment, Trajectory
from rllib_spear.metrics import pass_at_k, pass_at_k_values, source_name, source_table, task_metrics
from rllib_spear.testing import make_stats


def _traj(uid, source, success, **scores):
    task = {"uid": uid} if source is None else {"uid": uid, "data_source": source}
    return Trajectory(uid=uid, segments=[Segment("prompt", [1, 2]), Segment("assistant", [3], [-0.1], step=0)],
                      outcome_reward=float(success), step_rewards=[0.0], task=task,
                      stats=make_stats(success=bool(success), outcome_reward=float(success), **scores))


def test_pass_at_k_by_hand():
    # n=4, c=1: pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2; pass@4 = 1
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 1, 4) == 1.0
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # no correct sample: 0 for every k; n - c < k: 1
    assert pass_at_k(8, 0, 8) == 0.0
    assert pass_at_k(4, 3, 2) == 1.0


@pytest.mark.parametrize("args, what", [((0, 0, 1), "n"), ((4, 5, 1), "c"), ((4, 1, 0), "k"), ((4, 1, 5), "k")])
def test_pass_at_k_refuses_bad_input(args, what):
    with pytest.raises(ValueError, match=f"pass_at_k: {what}"):
        pass_at_k(*args)


def test_pass_at_k_values():
    assert pass_at_k_values(1) == [1]
    assert pass_at_k_values(4) == [1, 2, 4]
    assert pass_at_k_values(6) == [1, 2, 4, 6]
    assert pass_at_k_values(32) == [1, 2, 4, 8, 16, 32]


def test_source_names():
    assert source_name({"data_source": "nq"}) == "nq"
    assert source_name({}, "bamboogle") == "bamboogle"
    assert source_name({"data_source": "unknown"}, "nq_test") == "nq_test"  # the loaders' placeholder
    assert source_name({"data_source": "hotpot qa/dev"}) == "hotpot_qa_dev"  # one TensorBoard level
    assert source_name({"data_source": "avg"}) == "avg_"  # the average row's name is reserved


def test_greedy_per_source_and_unweighted_average():
    # source a: 3 tasks, 2 solved; source b: 1 task, solved. Pooled success would be 3/4;
    # the papers' avg weighs each benchmark once: (2/3 + 1) / 2 = 5/6.
    trajs = [_traj("a1", "a", 1, em=1.0, f1=1.0), _traj("a2", "a", 1, em=1.0, f1=0.5),
             _traj("a3", "a", 0, em=0.0, f1=0.25), _traj("b1", "b", 1, em=1.0, f1=1.0)]
    m = task_metrics(trajs)
    assert m["a/num_tasks"] == 3 and m["b/num_tasks"] == 1 and m["num_tasks"] == 4 and m["num_sources"] == 2
    assert m["a/success"] == pytest.approx(2 / 3) and m["b/success"] == 1.0
    assert m["a/em"] == pytest.approx(2 / 3)
    assert m["a/f1"] == pytest.approx((1.0 + 0.5 + 0.25) / 3)
    assert m["avg/success"] == pytest.approx(5 / 6)
    assert m["avg/f1"] == pytest.approx(((1.75 / 3) + 1.0) / 2)
    assert not any("pass_at" in k or "mean_at" in k for k in m), "greedy (n = 1): no pass@k"
    assert "avg/num_tasks" not in m  # counts are not averaged


def test_samples_give_mean_at_n_and_pass_at_k():
    # source a: task a1 with 4 samples, 1 correct; task a2, 4 samples, 0 correct.
    # source b: task b1 with 4 samples, 2 correct.
    outcomes = {("a1", "a"): [1, 0, 0, 0], ("a2", "a"): [0, 0, 0, 0], ("b1", "b"): [1, 1, 0, 0]}
    trajs = [_traj(uid, src, s) for (uid, src), ss in outcomes.items() for s in ss]
    m = task_metrics(trajs)
    assert m["a/num_episodes"] == 8 and m["num_episodes"] == 12
    assert m["a/mean_at_4"] == pytest.approx((0.25 + 0.0) / 2)
    assert m["a/pass_at_1"] == pytest.approx(0.125)
    assert m["a/pass_at_2"] == pytest.approx((0.5 + 0.0) / 2)  # 1 - C(3,2)/C(4,2) = 1/2 for a1
    assert m["a/pass_at_4"] == pytest.approx(0.5)
    # b1: c=2, pass@2 = 1 - C(2,2)/C(4,2) = 1 - 1/6
    assert m["b/pass_at_2"] == pytest.approx(5 / 6)
    assert m["b/pass_at_4"] == 1.0
    assert m["avg/pass_at_2"] == pytest.approx((0.25 + 5 / 6) / 2)
    assert m["avg/mean_at_4"] == pytest.approx((0.125 + 0.5) / 2)
    assert "a/em" not in m, "no score reported by the env: no em column"


def test_tasks_without_source_form_one_named_source():
    trajs = [_traj("q1", None, 1), _traj("q2", None, 0)]
    m = task_metrics(trajs, default_source="nq_test")
    assert m["nq_test/success"] == 0.5 and m["avg/success"] == 0.5
    assert task_metrics(trajs)["all/num_tasks"] == 2


def test_multi_answer_macro_scores_per_source():
    # per question: mean over its samples, then over questions (as before, now per source)
    trajs = [_traj("m1", "multi", 0, precision=1.0, recall=0.5, f1=2 / 3),
             _traj("m1", "multi", 0, precision=0.0, recall=0.0, f1=0.0),
             _traj("m2", "multi", 1, precision=1.0, recall=1.0, f1=1.0),
             _traj("m2", "multi", 1, precision=1.0, recall=1.0, f1=1.0)]
    m = task_metrics(trajs)
    assert m["multi/precision"] == pytest.approx((0.5 + 1.0) / 2)
    assert m["multi/recall"] == pytest.approx((0.25 + 1.0) / 2)
    assert m["multi/f1"] == pytest.approx((1 / 3 + 1.0) / 2)
    assert m["multi/pass_at_2"] == pytest.approx((0.0 + 1.0) / 2)


def test_source_table_rows_and_average_totals():
    m = task_metrics([_traj("a1", "a", 1), _traj("b1", "b", 0), _traj("b2", "b", 0)])
    rows, cols, cells = source_table(m)
    assert rows == ["a", "b", "avg"]
    assert cols[:2] == ["num_tasks", "num_episodes"] and "success" in cols
    assert cells["avg"]["num_tasks"] == 3 and cells["avg"]["success"] == 0.5

