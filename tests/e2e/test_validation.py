"""Validation during training (docs/design.md "Validation"): RLlib's evaluation_interval runs our
evaluation on the training runners, per data_source, with its own sampling parameters; results
reach the result dict and TensorBoard; a run trains the same with or without it (sync and
one_step_off); ``rllib-spear eval`` prints the per-benchmark table of a checkpoint."""
from __future__ import annotations

import json

import pytest
import torch

import rllib_spear  # noqa: F401  (registers the algorithms)
from rllib_spear import GRPOConfig
from rllib_spear.algorithms.grpo.grpo import EVALUATION_BEFORE_TRAIN

from e2e_helpers import recorder, small_config, with_trajectory_hook

SOURCES = ("fictional_1hop", "fictional_2hop")


@pytest.fixture(scope="module", autouse=True)
def one_learner_thread():
    """The tests below compare two trainings bitwise. Their learner is the local one, which keeps
    this process's torch threads (models/threads.py); with two, one CI run of 55ecc24 trained
    weights that differed from the other run's on identical samples. One thread for the module
    (restored after) takes intra-op scheduling out of the comparison."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


#: Two trainings on the same samples agree to float32 rounding, not bitwise: the async loop
#: batches requests as they arrive, and the engine log-probs the ratio divides by depend on a
#: row's batch at float32 rounding (docs/design.md "The agent loop", Seeds); one CI run of
#: 55ecc24 trained weights that differed from the other run's on identical sampled tokens. The
#: two updates move every weight by ~2e-4 (a changed sample or step moves them by that much).
WEIGHT_ROUNDING = 1e-6


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


@pytest.fixture(scope="module")
def eval_tasks():
    """Two tasks of each data_source of the embedded search test split."""
    from rllib_spear.envs import load_tasks

    tasks = load_tasks("search_qa", "test")
    return [t for s in SOURCES for t in [t for t in tasks if t["data_source"] == s][:2]]


def _config(eval_tasks, evaluate: bool, **training):
    cfg = (small_config(GRPOConfig, "embedded", **training)
           .env_runners(num_env_runners=1)
           .resources(num_cpus_for_main_process=0.5)
           .environment(eval_dataset=eval_tasks))
    if evaluate:  # sampled (T = 1, n = 2), so that a leaked seed or RNG draw would show in training
        cfg.evaluation(evaluation_interval=1, eval_before_train=True, eval_samples=2, eval_temperature=1.0,
                       eval_top_p=0.9, eval_max_new_tokens=12)
    return cfg


def _weights(algo):
    from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE

    state = algo.learner_group.get_state(components=COMPONENT_LEARNER + "/" + COMPONENT_RL_MODULE)
    (sd,) = state[COMPONENT_LEARNER][COMPONENT_RL_MODULE].values()
    return {k: torch.as_tensor(v).clone() for k, v in sd.items()}


def _train(cfg, iterations=2, checkpoint=None):
    """(results, final learner weights, the sampled training batches' assistant tokens)."""
    hook, calls = recorder(synthetic_rewards=True)
    algo = with_trajectory_hook(cfg, hook).build_algo()
    try:
        assert algo.eval_env_runner_group is None, "no separate evaluation runners (no second engine)"
        results = [algo.train() for _ in range(iterations)]
        if checkpoint is not None:
            algo.save_to_path(str(checkpoint))
        return results, _weights(algo), [[t.assistant_token_ids() for t in trajs] for trajs, _ in calls]
    finally:
        algo.stop()


@pytest.fixture(scope="module")
def evaluated_run(ray_session, eval_tasks, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("validation") / "ckpt"
    return (*_train(_config(eval_tasks, evaluate=True), checkpoint=ckpt), ckpt)


def _check_evaluation(ev, samples=2):
    for s in (*SOURCES, "avg"):
        for m in ("success", "em", "f1", f"mean_at_{samples}", "pass_at_1", f"pass_at_{samples}"):
            assert 0.0 <= ev[f"{s}/{m}"] <= 1.0, (s, m, sorted(ev))
    for s in SOURCES:
        assert ev[f"{s}/num_tasks"] == 2 and ev[f"{s}/num_episodes"] == 2 * samples
    assert ev["num_tasks"] == 4 and ev["num_sources"] == 2 and ev["lost_env_runner_samples"] == 0
    assert ev["avg/success"] == pytest.approx((ev["fictional_1hop/success"] + ev["fictional_2hop/success"]) / 2)


def test_per_source_evaluation_in_the_results(evaluated_run):
    results, _, _, _ = evaluated_run
    assert EVALUATION_BEFORE_TRAIN in results[0] and EVALUATION_BEFORE_TRAIN not in results[1]
    _check_evaluation(results[0][EVALUATION_BEFORE_TRAIN])
    assert results[0][EVALUATION_BEFORE_TRAIN]["policy_version"] == 0, "before any update"
    for k, r in enumerate(results, start=1):
        _check_evaluation(r["evaluation"])
        assert r["evaluation"]["policy_version"] == k, "the weights after this iteration's update"
        assert r["env_runners"]["num_episodes"] == 8, "training batches are the training ones"


def test_evaluation_reaches_tensorboard(evaluated_run, tmp_path):
    """Tune's TensorBoard logger on these results: every per-source tag arrives, unrenamed."""
    from ray.tune.logger import TBXLoggerCallback
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    class Trial:  # what the callback uses of a Tune trial
        local_path = str(tmp_path)
        evaluated_params: dict = {}

        def init_local_path(self):
            pass

    results, _, _, _ = evaluated_run
    cb, trial = TBXLoggerCallback(), Trial()
    for r in results:
        cb.log_trial_result(r["training_iteration"], trial, r)
    cb.log_trial_end(trial)
    tags = set(EventAccumulator(str(tmp_path)).Reload().Tags()["scalars"])
    for tag in ("evaluation/fictional_1hop/em", "evaluation/avg/em", "evaluation/avg/pass_at_2",
                "evaluation/fictional_2hop/mean_at_2", "evaluation_before_train/avg/success"):
        assert f"ray/tune/{tag}" in tags, sorted(t for t in tags if "evaluation" in t)


def test_evaluation_does_not_change_training(evaluated_run, eval_tasks):
    results, weights, sampled, _ = evaluated_run
    plain_results, plain_weights, plain_sampled = _train(_config(eval_tasks, evaluate=False))
    assert "evaluation" not in plain_results[-1]
    assert sampled == plain_sampled, "the same training samples"
    assert weights.keys() == plain_weights.keys()
    assert _max_diff(weights, plain_weights) <= WEIGHT_ROUNDING, "the same trained weights"
    for r, p in zip(results, plain_results):
        for key in ("reward_total_mean", "success_rate", "response_length_mean", "num_episodes"):
            assert r["env_runners"][key] == p["env_runners"][key], key
        grad_norm = r["learners"]["default_policy"]["grad_norm"]
        assert grad_norm == pytest.approx(p["learners"]["default_policy"]["grad_norm"], rel=1e-6)


def test_one_step_off_evaluation_keeps_the_sample_in_flight(ray_session, eval_tasks):
    """The sample launched for the next iteration is in flight while RLlib evaluates; it is
    neither consumed nor lost, and the run trains exactly as without evaluation."""
    on = _train(_config(eval_tasks, evaluate=True, rollout_pipeline="one_step_off"))
    off = _train(_config(eval_tasks, evaluate=False, rollout_pipeline="one_step_off"))
    for r in on[0]:
        _check_evaluation(r["evaluation"])
        assert r["env_runners"]["num_episodes"] == 8 and r["dropped_stale_trajectories"] == 0
        assert r["lost_env_runner_samples"] == 0
    assert on[2] == off[2], "the same batches, one update behind as always"
    assert _max_diff(on[1], off[1]) <= WEIGHT_ROUNDING


def test_cli_eval_prints_the_per_source_table(evaluated_run, eval_tasks, tmp_path, capsys):
    """``rllib-spear eval`` (in this process, on the test's Ray session) with a dataset of its
    own, sampling settings and --json."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rllib_spear.cli import main

    _, _, _, ckpt = evaluated_run
    data = tmp_path / "bench.parquet"  # no data_source column: one source named after the file
    pq.write_table(pa.Table.from_pylist([{"question": t["question"], "golden_answers": t["golden_answers"]}
                                         for t in eval_tasks]), data)
    out_json = tmp_path / "out.json"
    assert main(["eval", str(ckpt), "--dataset", str(data), "--n", "2", "--temperature", "1", "--top-p", "0.6",
                 "--num-tasks", "3", "--max-new-tokens", "8", "--json", str(out_json)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("source"))
    cols = lines[header].split()
    assert cols[:4] == ["source", "num_tasks", "num_episodes", "success"] and "pass_at_2" in cols
    rows = [ln.split() for ln in lines[header + 1:header + 3]]
    assert [r[0] for r in rows] == ["bench", "avg"] and rows[0][1:3] == ["3", "6"]
    saved = json.loads(out_json.read_text())
    assert saved["settings"] == {**saved["settings"], "n": 2, "temperature": 1.0, "top_p": 0.6,
                                 "max_new_tokens": 8, "num_tasks": 3, "split": "test"}
    assert saved["metrics"]["bench/num_tasks"] == 3 and "avg/pass_at_2" in saved["metrics"]
    assert main(["eval", str(ckpt), "--top-p", "0"]) == 2, "a bad setting: a message, exit 2"
    assert "top_p" in capsys.readouterr().err


def test_missing_eval_dataset_fails_at_build(ray_session, tmp_path):
    """A recipe's placeholder eval set that is not there fails in validate(), before any actor
    starts (the error names the field and the path), not at the first evaluation, 50 iterations in."""
    missing = tmp_path / "search_r1_test.parquet"
    cfg = (small_config(GRPOConfig, "embedded").environment(eval_dataset=str(missing))
           .evaluation(evaluation_interval=50))
    with pytest.raises(ValueError, match="`eval_dataset` '.*search_r1_test.parquet' does not exist"):
        cfg.build_algo()
