"""The recipe layer: registries, knobs that join the configs, user reward functions, SIL as a
feature of any algorithm, and no Ray import."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from rllib_spear import GRPOConfig, SPADERConfig, SPEARConfig
from rllib_spear.core.trajectory import Segment, Trajectory
from rllib_spear.recipe import (
    RESPONSE_FILTERS, REWARD_FNS, REWARD_SHAPERS, Recipe, register_response_filter, register_reward_fn,
    register_reward_shaper,
)
from rllib_spear.testing import make_stats


def _traj(uid, outcome, tool_calls=0, text="<answer>x</answer>", task=None, n_gen=2):
    segs = [Segment("prompt", [1, 2]), Segment("assistant", list(range(10, 10 + n_gen)), [-0.5] * n_gen, step=0)]
    t = Trajectory(uid=uid, segments=segs, outcome_reward=outcome, step_rewards=[0.0],
                   stats=make_stats(tool_calls=tool_calls, success=outcome > 0), task=task or {"answer": "x"})
    t.rollout.assistant_texts = [text]
    return t


def test_algorithms_are_configs_that_name_their_pieces():
    g, s, d = GRPOConfig(), SPEARConfig(), SPADERConfig()
    assert (g.advantage_estimator, tuple(g.reward_shapers), g.sil_enabled) == ("grpo", (), False)
    assert (tuple(s.reward_shapers), s.sil_enabled, s.loss_mode) == (("tool_call_bonus",), True, "clip_cov")
    assert (d.advantage_estimator, tuple(d.reward_shapers), d.sil_enabled) == ("spa", ("spader_diversity",), False)
    # every piece's knobs are training() kwargs of every algorithm (SIL on GRPO, diversity on SPEAR)
    g.training(sil_enabled=True, sil_capacity=8, diversity_alpha=2.0)
    assert (g.sil_enabled, g.sil_capacity, g.diversity_alpha) == (True, 8, 2.0)
    assert Recipe(g).sil is not None


def test_user_reward_fn_adds_a_named_component():
    def exact(task, response, stats):
        return float(task["answer"] in response) + 0.5 * stats.tool_calls

    cfg = GRPOConfig().training(reward_fns=[exact])
    cfg.validate()
    trajs = [_traj("q", 0.0, tool_calls=1), _traj("q", 1.0, text="nothing")]
    Recipe(cfg).shape_rewards(trajs, step=1)
    assert [t.rewards["reward_fns/exact"] for t in trajs] == [1.5, 0.0]
    assert trajs[0].total_reward == 1.5 and trajs[1].total_reward == 1.0


def test_registered_reward_fn_by_name_and_bad_returns():
    register_reward_fn("length_penalty", lambda task, response, stats: -0.01 * len(response))
    try:
        cfg = GRPOConfig().training(reward_fns=["length_penalty"])
        t = _traj("q", 0.0, text="abcd")
        Recipe(cfg).shape_rewards([t], step=1)
        assert t.rewards["reward_fns/length_penalty"] == pytest.approx(-0.04)
        with pytest.raises(ValueError, match="reward_fns"):
            GRPOConfig().training(reward_fns=["no_such_fn"]).validate()
        with pytest.raises(ValueError, match="returned nan"):
            Recipe(GRPOConfig().training(reward_fns=[lambda *a: float("nan")])).shape_rewards([t], 1)
    finally:
        REWARD_FNS.unregister("length_penalty")


def test_user_shaper_and_filter_with_their_own_knobs():
    @register_reward_shaper("test_length_bonus", defaults={"length_bonus_scale": 0.1},
                            validate=lambda cfg, err: cfg.length_bonus_scale >= 0 or err("`length_bonus_scale` < 0"),
                            metrics_namespace="test")
    def length_bonus(trajs, step, cfg):
        for t in trajs:
            t.rewards["length"] = cfg.length_bonus_scale * t.num_generated_tokens
        return {"scale": cfg.length_bonus_scale}

    @register_response_filter("test_too_short", defaults={"min_generated_tokens": 3})
    def too_short(traj, cfg):
        return traj.num_generated_tokens < cfg.min_generated_tokens

    try:
        cfg = GRPOConfig().training(reward_shapers=["test_length_bonus"], length_bonus_scale=0.5,
                                    response_filters=["test_too_short"])
        cfg.validate()
        with pytest.raises(ValueError, match="length_bonus_scale"):
            GRPOConfig().training(reward_shapers=["test_length_bonus"], length_bonus_scale=-1.0).validate()
        recipe = Recipe(cfg)
        trajs = [_traj("q", 1.0, n_gen=2), _traj("q", 0.0, n_gen=4)]
        assert recipe.shape_rewards(trajs, step=3) == {("test", "scale"): 0.5}
        assert [t.rewards["length"] for t in trajs] == [1.0, 2.0]
        kept = recipe.filter(trajs)
        assert kept.filtered == [True, False] and kept.fractions["test_too_short"] == 0.5
        assert not kept.masks[0].any() and kept.masks[1].sum() == 4
    finally:
        REWARD_SHAPERS.unregister("test_length_bonus")
        RESPONSE_FILTERS.unregister("test_too_short")


def test_unknown_piece_names_are_refused_early_naming_the_key():
    for key, value in (("advantage_estimator", "gae"), ("reward_shapers", ("bonus",)),
                       ("response_filters", ("toolong",))):
        with pytest.raises(ValueError, match=f"`{key}`.*register one with"):
            GRPOConfig().training(**{key: value}).validate()


def test_sil_on_grpo_replays_and_checkpoints():
    cfg = GRPOConfig().training(sil_enabled=True, sil_trigger="continuous", sil_replay_batch_size=2)
    recipe = Recipe(cfg)
    trajs = [_traj("q", 1.0), _traj("q", 0.0)]
    adv = recipe.advantages(trajs)
    kept = recipe.filter(trajs)
    replay = recipe.replay(1)
    assert replay.rows == []
    m = recipe.after_update(trajs, adv, kept, 1, replay)
    assert m[("spear", "sil_added")] == 1
    state = recipe.get_state()
    again = Recipe(cfg)
    again.set_state(state)
    r1, r2 = recipe.replay(2), again.replay(2)
    assert [r.traj.traj_id for r in r1.rows] == [r.traj.traj_id for r in r2.rows] != []
    assert np.all(r1.rows[0].advantages[r1.rows[0].loss_mask > 0] > 0)


def test_recipe_layer_imports_no_ray():
    code = ("import sys; import rllib_spear.recipe, rllib_spear.core.episode, rllib_spear.testing, rllib_spear.metrics; "
            "bad = sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')); "
            "print(bad); sys.exit(1 if bad else 0)")
    env = {**os.environ, "RLLIB_SPEAR_NO_REGISTER": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
