"""``learners(packed_microbatches=True)``: a learner update with packed micro-batches
(models/packing.py) gives the loss, grad norm and metrics of the padded one (float32, 1e-5), on
ragged rows with prompts, observations, replayed rows, TIS' recomputed logp_old, the entropy
bonus and the KL term's reference forward. Through ``LocalUpdate`` (the Ray-free path the GPU
check times) and through the RLlib learner (the knob reaches the module and the reference via
``learner.module_layout``)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from rllib_spear import GRPOConfig
from rllib_spear.core.trajectory import Segment, Trajectory
from rllib_spear.learner.core import LocalUpdate, UpdateSettings
from rllib_spear.learner.optim import build_adamw
from rllib_spear.recipe.batching import LearnerRow, build_learner_batches

from learner_update import learner_update_metrics

TRAINING = dict(lr=1e-3, micro_batch_token_budget=48, num_epochs=2, loss_mode="clip_cov", clip_cov_ratio=0.2,
                entropy_metric_tokens=7)


@pytest.fixture(scope="module")
def path():
    from rllib_spear.models.factory import tiny_model_path

    return tiny_model_path()


def _rows() -> list[LearnerRow]:
    """6 two-turn trajectories of different lengths (prompt | assistant | observation |
    assistant) in 3 groups, the last group replayed."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(6):
        tok = lambda k: rng.integers(3, 500, k).tolist()  # noqa: E731
        lp = lambda k: (-0.5 - rng.random(k)).tolist()  # noqa: E731
        segs = [Segment("prompt", tok(4 + 2 * i)), Segment("assistant", tok(5), lp(5), 0),
                Segment("observation", tok(3 + i)), Segment("assistant", tok(2 + 2 * i), lp(2 + 2 * i), 1)]
        t = Trajectory(uid=f"g{i // 2}", segments=segs, outcome_reward=float(i % 2), step_rewards=[0.0, 0.0],
                       traj_id=f"t{i}")
        rows.append(LearnerRow(t, t.token_advantages(0.7 if i % 2 else -0.4), t.loss_mask(),
                               is_replay=i >= 4, loss_weight=0.3 if i >= 4 else 1.0))
    return rows


def _batch() -> dict:
    return build_learner_batches(_rows(), num_learners=0, minibatch_size=2, t_norm=64.0, pad_token_id=0, seed=0,
                                 num_epochs=TRAINING["num_epochs"])[0]


def _config(path, *, packed: bool, attn: str | None = None, **training):
    model_config = {"model_path": path, **({"attn_implementation": attn} if attn else {})}
    return (GRPOConfig().environment("search_qa").env_runners(num_env_runners=0)
            .training(**{**TRAINING, **training}).learners(packed_microbatches=packed)
            .rl_module(model_config=model_config).debugging(seed=0))


def _assert_same(packed: dict, padded: dict) -> None:
    assert {"total_loss", "pg_loss", "grad_norm"} <= set(padded) and set(packed) == set(padded)
    for k, v in padded.items():
        assert packed[k] == pytest.approx(v, rel=1e-5, abs=1e-5), k


@pytest.mark.parametrize("training", [{}, {"entropy_coeff": 0.01, "tis_cap": 2.0}], ids=["grpo", "entropy+tis"])
def test_local_update_packed_equals_padded(path, training):
    from transformers import AutoModelForCausalLM

    config = _config(path, packed=False, **training)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    out, weights = {}, {}
    for packed in (False, True):
        model = copy.deepcopy(base)
        opt = build_adamw([p for p in model.parameters()], lr=config.lr, betas=tuple(config.adam_betas),
                          weight_decay=config.weight_decay)
        update = LocalUpdate(model, opt, loss_config=lambda replay: config.policy_loss_config(replay=replay),
                             settings=UpdateSettings.of(config.copy(copy_frozen=False).learners(
                                 packed_microbatches=packed)), device="cpu", grad_clip=config.grad_clip, seed=0)
        out[packed] = update.update(_batch())
        weights[packed] = update.grad_norms, model.state_dict()
    assert out[True]["num_optimizer_steps"] == 6
    _assert_same(out[True], out[False])
    np.testing.assert_allclose(weights[True][0], weights[False][0], rtol=1e-5)  # every step's grad norm
    step = max(float((v - base.state_dict()[k]).abs().max()) for k, v in weights[False][1].items())
    diff = max(float((v - weights[False][1][k]).abs().max()) for k, v in weights[True][1].items())
    assert step > 1e-4 and diff < 1e-3 * step


def _learner_update(cfg) -> dict:
    return learner_update_metrics(cfg, _batch())


def test_rllib_learner_packed_equals_padded_with_the_kl_reference(path, monkeypatch):
    from rllib_spear.models import packing

    calls = []
    real_pack = packing.pack_rows
    monkeypatch.setattr(packing, "pack_rows", lambda *a: calls.append(1) or real_pack(*a))
    padded = _learner_update(_config(path, packed=False, kl_coeff=0.05))
    assert not calls  # the default scores padded rows
    packed = _learner_update(_config(path, packed=True, kl_coeff=0.05))
    assert calls  # the knob reached the module (and the reference)
    assert "kl" in " ".join(padded)
    _assert_same(packed, padded)


def test_rllib_learner_packed_varlen_equals_padded(path, monkeypatch):
    """model_config["attn_implementation"]="sdpa_varlen": the learner (and its KL reference)
    score packed rows one document per SDPA call, and the update equals the padded sdpa one."""
    from rllib_spear.models import varlen_attention

    calls = []
    real_bounds = varlen_attention.document_bounds
    monkeypatch.setattr(varlen_attention, "document_bounds", lambda pos: calls.append(1) or real_bounds(pos))
    padded = _learner_update(_config(path, packed=False, kl_coeff=0.05))
    packed = _learner_update(_config(path, packed=True, attn="sdpa_varlen", kl_coeff=0.05))
    assert calls  # the varlen kernel ran
    _assert_same(packed, padded)


def test_validate_refuses_a_non_bool_knob():
    cfg = GRPOConfig().learners(packed_microbatches="yes").rl_module(model_config={"model_path": "embedded"})
    with pytest.raises(ValueError, match="packed_microbatches"):
        cfg.validate()


def test_the_learner_refuses_a_model_without_packed_attention(path, monkeypatch):
    from rllib_spear.learner.module_layout import ModuleLayout

    layout = ModuleLayout(_config(path, packed=True), None)

    class Module:
        model = torch.nn.Linear(1, 1)  # no config._attn_implementation: cannot mask packed rows

    with pytest.raises(ValueError, match="packed_microbatches"):
        layout.apply_packing(Module(), Module.model)
