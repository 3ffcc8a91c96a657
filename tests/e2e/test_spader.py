"""SPADER: hand-checked step rewards and step-wise peer advantages, then end to end through
RLlib / Tune on a tiny model and the embedded multi-answer search task, checkpoint/restore and
``rllib-spear eval``."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

import rllib_spear  # noqa: F401  (registers the algorithms)
from rllib_spear import SPADER, SPADERConfig
from rllib_spear.core.trajectory import Segment, Trajectory
from rllib_spear.recipe import Recipe
from rllib_spear.testing import make_stats

from e2e_helpers import small_config

# ----------------------------------------------------------------------------------------------
# 1. Hand-built group through SPADER's recipe (no model, no Ray cluster)
# ----------------------------------------------------------------------------------------------

GOLD = 4  # |GT|: entities 0..3 of one question
STEP = 150  # c(150) = 0.01 * (150 - 100) / 100 = 0.005
C = 0.005


def _traj(uid, spans, info, traj_id):
    """spans: list of (kind, length); assistant spans get consecutive step indices."""
    segs, step, tok = [], 0, 100
    for kind, n in spans:
        ids = list(range(tok, tok + n))
        tok += n
        if kind == "assistant":
            segs.append(Segment("assistant", ids, logprobs=[-0.5] * n, step=step))
            step += 1
        else:
            segs.append(Segment(kind, ids))
    return Trajectory(uid=uid, segments=segs, outcome_reward=info.get("f1", 0.0), stats=make_stats(**info),
                      traj_id=traj_id)


def _group():
    # A: step0 searches 2 queries and the response holds entities {0, 1}; step1 1 query -> {1, 2}
    #    (1 is old for A); step2 answers with F1 0.8.
    a = _traj("q1", [("prompt", 5), ("assistant", 3), ("observation", 4), ("assistant", 2),
                     ("observation", 6), ("assistant", 4)],
              {"found_entities_per_step": [[0, 1], [1, 2], []], "queries_per_step": [2, 1, 0],
               "num_gold_entities": GOLD, "f1": 0.8, "precision": 1.0, "recall": 2 / 3,
               "format_ok": True, "tool_calls": 2}, "a")
    # B: step0 1 query -> {0}; step1 3 queries -> {3}; step2 answers with F1 0.5.
    b = _traj("q1", [("prompt", 5), ("assistant", 2), ("observation", 3), ("assistant", 5),
                     ("observation", 2), ("assistant", 1)],
              {"found_entities_per_step": [[0], [3], []], "queries_per_step": [1, 3, 0],
               "num_gold_entities": GOLD, "f1": 0.5, "precision": 0.5, "recall": 0.5,
               "format_ok": True, "tool_calls": 2}, "b")
    # C (2 steps only, padded at step 2): step0 1 query, nothing found; step1 answers, F1 0.25.
    c = _traj("q1", [("prompt", 5), ("assistant", 4), ("observation", 3), ("assistant", 2)],
              {"found_entities_per_step": [[], []], "queries_per_step": [1, 0],
               "num_gold_entities": GOLD, "f1": 0.25, "precision": 0.25, "recall": 0.25,
               "format_ok": True, "tool_calls": 1}, "c")
    return [a, b, c]


def _recipe(**training):
    return Recipe(SPADERConfig().training(**training) if training else SPADERConfig())


def _hand_rewards(outcomes):
    """Per-step rewards r_k(i) written out by hand (alpha=1, beta=4, lam=1, |GT|=4, c=0.005)."""
    w1 = 1 + 4 * math.exp(-0.0)  # N(e) = 1: e1 (A only), e2 (A only), e3 (B only) -> 5
    w2 = 1 + 4 * math.exp(-1.0)  # N(e) = 2: e0 (found by A and B)
    oa, ob, oc = outcomes
    ra = [(w2 + w1) / 4 - C * 2 / 4,   # A step0: new {0, 1}, 2 queries
          w1 / 4 - C * 1 / 4,          # A step1: new {2} (1 already found), 1 query
          0.0 - 0.0 + oa]              # A step2: answer, 0 queries, + outcome
    rb = [w2 / 4 - C * 1 / 4,          # B step0: new {0}, 1 query
          w1 / 4 - C * 3 / 4,          # B step1: new {3}, 3 queries
          0.0 + ob]                    # B step2: answer
    rc = [0.0 - C * 1 / 4,             # C step0: nothing, 1 query
          0.0 + oc]                    # C step1: answer
    return ra, rb, rc


def _hand_advantages(rewards):
    """G_k with gamma 0.9, padded G = 0, per-step population mean/var, A = (G-mu)/sqrt(var+1e-6)."""
    ra, rb, rc = rewards
    g = 0.9
    ga = [ra[0] + g * ra[1] + g * g * ra[2], ra[1] + g * ra[2], ra[2]]
    gb = [rb[0] + g * rb[1] + g * g * rb[2], rb[1] + g * rb[2], rb[2]]
    gc = [rc[0] + g * rc[1], rc[1], 0.0]  # step 2 padded with G = 0
    adv = [[], [], []]
    for k in range(3):
        col = [ga[k], gb[k], gc[k]]
        mu = (col[0] + col[1] + col[2]) / 3
        var = ((col[0] - mu) ** 2 + (col[1] - mu) ** 2 + (col[2] - mu) ** 2) / 3
        for i in range(3):
            adv[i].append((col[i] - mu) / math.sqrt(var + 1e-6))
    return adv[0], adv[1], adv[2][:2]  # C has no step 2


def _expected_tokens(traj, step_adv):
    out = []
    for s in traj.segments:
        out += [step_adv[s.step] if s.kind == "assistant" else 0.0] * len(s.token_ids)
    return np.asarray(out)


def _check_group(trajs, recipe, outcomes):
    # the diversity part of the step rewards (shape_rewards stores them without the outcome)
    hand = _hand_rewards(outcomes)
    for t, r, o in zip(trajs, hand, outcomes):
        div = list(r)
        div[-1] -= o
        np.testing.assert_allclose(t.step_rewards, div, rtol=0, atol=1e-12)
        assert t.outcome_reward == pytest.approx(o, abs=1e-12)
        assert t.rewards.get("tool_bonus", 0.0) == 0.0  # SPEAR bonus is off in SPADER
        assert t.total_reward == pytest.approx(sum(r), abs=1e-12)
    adv = recipe.advantages(trajs)
    token_adv, episode_adv = adv.token, adv.episode
    hand_adv = _hand_advantages(hand)
    for t, ta, ha in zip(trajs, token_adv, hand_adv):
        np.testing.assert_allclose(t.derived["step_advantages"], ha, rtol=0, atol=1e-9)
        assert ta.shape == (t.length,)
        np.testing.assert_allclose(ta, _expected_tokens(t, ha), rtol=0, atol=1e-5)  # float32
        assert np.all(ta[t.loss_mask() == 0] == 0.0)  # prompt + observation tokens
        assert np.all(ta[: t.prompt_length] == 0.0)
    totals = [sum(r) for r in hand]
    np.testing.assert_allclose(episode_adv, np.array(totals) - np.mean(totals), atol=1e-12)
    return hand


def test_hand_built_group_rewards_and_advantages():
    recipe = _recipe()
    trajs = _group()
    metrics = recipe.shape_rewards(trajs, step=STEP)
    hand = _check_group(trajs, recipe, (0.8, 0.5, 0.25))

    # Concrete numbers (one place where an error in the hand formulas would show).
    e1 = math.exp(-1.0)
    assert hand[0][0] == pytest.approx((1 + 4 * e1 + 5) / 4 - 0.0025)
    assert hand[2][0] == pytest.approx(-0.00125)

    m = {k: metrics[("spader", k)] for k in (
        "step_reward_mean", "entities_found_per_episode", "unique_entities_per_group",
        "rarity_weighted_discoveries", "queries_per_step", "tool_cost_weight")}
    div = [r for t in trajs for r in t.step_rewards]  # 8 steps
    assert m["step_reward_mean"] == pytest.approx(sum(div) / 8)
    assert m["entities_found_per_episode"] == pytest.approx((3 + 2 + 0) / 3)
    assert m["unique_entities_per_group"] == pytest.approx(4.0)
    assert m["rarity_weighted_discoveries"] == pytest.approx(((1 + 4 * e1 + 5 + 5) + (1 + 4 * e1 + 5) + 0) / 3)
    assert m["queries_per_step"] == pytest.approx((2 + 1 + 0 + 1 + 3 + 0 + 1 + 0) / 8)
    assert m["tool_cost_weight"] == pytest.approx(C)
    assert trajs[0].derived["entities_found"] == 3 and trajs[2].derived["entities_found"] == 0

    # Before the cost-free phase ends there is no cost: c(99) = 0.
    t0 = _group()
    metrics0 = _recipe().shape_rewards(t0, step=99)
    assert t0[2].step_rewards[0] == 0.0
    assert metrics0[("spader", "tool_cost_weight")] == 0.0


def test_hand_built_group_format_error_reward():
    recipe = _recipe(format_error_reward=-1)
    trajs = _group()
    trajs[1].stats.format_ok = False  # B answered with malformed output (F1 ignored)
    recipe.shape_rewards(trajs, step=STEP)
    _check_group(trajs, recipe, (0.8, -1.0, 0.25))

    # Released default (0): a malformed answer earns 0 on the answer step.
    recipe = _recipe()
    trajs = _group()
    trajs[1].stats.format_ok = False
    recipe.shape_rewards(trajs, step=STEP)
    _check_group(trajs, recipe, (0.8, 0.0, 0.25))


# ----------------------------------------------------------------------------------------------
# 2. End to end on the embedded multi-answer task
# ----------------------------------------------------------------------------------------------

EXPECTED_SPADER_KEYS = {"step_reward_mean", "entities_found_per_episode", "unique_entities_per_group",
                        "rarity_weighted_discoveries", "queries_per_step", "tool_cost_weight"}
EXPECTED_RUNNER_KEYS = {"precision_mean", "recall_mean", "f1_mean", "reward_total_mean",
                        "reward_outcome_mean", "turns_mean", "policy_version_lag_max"}


def _spader_config(model_path):
    return (small_config(SPADERConfig, model_path)
            .environment("multi_answer_search")
            .env_runners(max_turns=3))


def test_tune_run(ray_session, tiny_model, tmp_path):
    from ray import tune

    cfg = _spader_config(tiny_model)
    analysis = tune.run("SPADER", config=cfg.to_dict(), stop={"training_iteration": 2},
                        storage_path=str(tmp_path / "run"), verbose=0)
    trial = analysis.trials[0]
    assert trial.status == "TERMINATED", trial.error_file
    r = trial.last_result
    assert r["training_iteration"] == 2
    assert EXPECTED_SPADER_KEYS <= set(r["spader"]), EXPECTED_SPADER_KEYS - set(r["spader"])
    assert EXPECTED_RUNNER_KEYS <= set(r["env_runners"]), EXPECTED_RUNNER_KEYS - set(r["env_runners"])
    for k in ("precision_mean", "recall_mean", "f1_mean"):
        assert 0.0 <= r["env_runners"][k] <= 1.0
    assert r["spader"]["tool_cost_weight"] == 0.0  # step 2 < cost_free_steps
    assert r["spader"]["queries_per_step"] >= 0.0
    assert r["env_runners"]["policy_version_lag_max"] == 0


@pytest.fixture(scope="module")
def spader_checkpoint(ray_session, tiny_model, tmp_path_factory):
    cfg = _spader_config(tiny_model)
    algo = cfg.build_algo()
    try:
        algo.train()
        assert algo.algo_step == 1
        ckpt = algo.save_to_path(str(tmp_path_factory.mktemp("spader") / "ckpt"))
    finally:
        algo.stop()
    return ckpt


def test_checkpoint_restore_same_process(spader_checkpoint):
    from ray.rllib.algorithms.algorithm import Algorithm

    algo = Algorithm.from_checkpoint(spader_checkpoint)
    try:
        assert isinstance(algo, SPADER)
        assert algo.algo_step == 1
        r = algo.train()
        assert algo.algo_step == 2
        assert EXPECTED_SPADER_KEYS <= set(r["spader"])
        assert r["env_runners"]["policy_version_lag_max"] == 0
    finally:
        algo.stop()


def test_cli_eval_prints_macro_metrics(spader_checkpoint, tmp_path):
    import json

    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "GLOO_SOCKET_IFNAME": "lo"}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-m", "rllib_spear.cli", "eval", spader_checkpoint,
                          "--num-tasks", "4", "--json", str(tmp_path / "eval.json")],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    metrics = json.loads((tmp_path / "eval.json").read_text())["metrics"]
    for k in ("precision", "recall", "f1"):  # macro over questions, per data_source and averaged
        assert 0.0 <= metrics[f"avg/{k}"] <= 1.0, out.stdout[-3000:]
    assert metrics["num_tasks"] == 4.0
    assert any(ln.startswith("avg ") for ln in out.stdout.splitlines()), out.stdout[-3000:]


def test_cli_trains_the_spader_demo_config_and_reports_f1(tmp_path):
    """configs/spader_cpu_demo.yaml as a user runs it (shortened): the multi-answer cold start on
    the env config it was trained on, with the F1 trend (not the rare full-set success) at the end."""
    from pathlib import Path

    demo = Path(__file__).resolve().parents[2] / "configs" / "spader_cpu_demo.yaml"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "GLOO_SOCKET_IFNAME": "lo"}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-m", "rllib_spear.cli", "train", str(demo),
                          "--set", "stop.training_iteration=2", "--set", f"storage_path={tmp_path}",
                          "--set", "checkpoint_freq=0", "--set", "num_cpus=2",
                          "--set", "training.tasks_per_iteration=2", "--set", "training.group_size=4"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    assert "iter   2 | reward" in out.stdout and "| f1 " in out.stdout
    assert "f1 by iterations: 1-1:" in out.stdout, out.stdout[-2000:]
    assert "was trained to call tools with parser" not in out.stdout + out.stderr  # the matching env config
    # the console stays readable: one line per iteration, no per-process RLlib notice, no build
    assert [ln.split("|")[0].strip() for ln in out.stdout.splitlines() if ln.startswith("iter ")] == ["iter   1", "iter   2"]
    assert "on the new API stack" not in out.stdout + out.stderr
    assert "Checkpoint successfully created" not in out.stdout + out.stderr
    assert "Loading weights" not in out.stdout + out.stderr
    assert "building it under" not in out.stderr  # the shipped cold start was found
