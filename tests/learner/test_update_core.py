"""The Ray-free update core (learner/core.py): the RLlib learner runs its whole update through one
call of it, and ``LocalUpdate`` -- what benchmarks/gpu_learner_check.py trains with on a machine
without Ray -- moves the weights as the RLlib learner does."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

from rllib_spear import GRPOConfig
from ray.rllib.core.learner.learner import Learner
from ray.rllib.core.learner.torch.torch_learner import TorchLearner

from rllib_spear.learner import core as update_core
from rllib_spear.learner import steps
from rllib_spear.learner.optim import build_adamw
from rllib_spear.learner.state import seeded_generator
from rllib_spear.core.losses import PolicyLossConfig
from rllib_spear.core.trajectory import Segment, Trajectory
from rllib_spear.recipe.batching import LearnerRow, build_learner_batches


@pytest.fixture(scope="module")
def path():
    from rllib_spear.models.factory import tiny_model_path

    return tiny_model_path()


def _rows() -> list[LearnerRow]:
    """6 two-turn trajectories in 3 groups; the last group is replayed (SIL, weight 0.5), so both
    loss parts run. Behaviour log-probs -1.0: the first ratio is not 1."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(6):
        tok = lambda k: rng.integers(3, 500, k).tolist()  # noqa: E731
        segs = [Segment("prompt", tok(6 + i)), Segment("assistant", tok(5), [-1.0] * 5, 0),
                Segment("observation", tok(4)), Segment("assistant", tok(3 + i), [-1.0] * (3 + i), 1)]
        t = Trajectory(uid=f"g{i // 2}", segments=segs, outcome_reward=float(i % 2), step_rewards=[0.0, 0.0],
                       traj_id=f"t{i}")
        rows.append(LearnerRow(t, t.token_advantages(0.5 if i % 2 else -0.5), t.loss_mask(),
                               is_replay=i >= 4, loss_weight=0.5 if i >= 4 else 1.0))
    return rows


TRAINING = dict(lr=1e-3, micro_batch_token_budget=48, num_epochs=2, loss_mode="clip_cov", clip_cov_ratio=0.2,
                entropy_metric_tokens=7)


def _learner(path):
    cfg = (GRPOConfig().environment("search_qa").env_runners(num_env_runners=0).training(**TRAINING)
           .rl_module(model_config={"model_path": path}).debugging(seed=0))
    return cfg.build_learner(env=None)


def _batch() -> dict:
    return build_learner_batches(_rows(), num_learners=0, minibatch_size=2, t_norm=64.0, pad_token_id=0, seed=0,
                                 num_epochs=TRAINING["num_epochs"])[0]


def _learner_update(learner, batch) -> dict:
    mab = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(dict(batch))}, env_steps=len(batch["input_ids"]))
    res = learner.update(batch=mab, timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 1})
    res = res[0] if isinstance(res, list) else res
    peek = lambda v: v.peek() if hasattr(v, "peek") else v  # noqa: E731
    return {k: float(peek(v)) for k, v in res[DEFAULT_MODULE_ID].items() if np.ndim(peek(v)) == 0}


def _local(model, config) -> update_core.LocalUpdate:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = build_adamw(params, lr=config.lr, betas=tuple(config.adam_betas), weight_decay=config.weight_decay)
    return update_core.LocalUpdate(model, opt, loss_config=lambda replay: config.policy_loss_config(replay=replay),
                                   settings=update_core.UpdateSettings.of(config), device="cpu",
                                   grad_clip=config.grad_clip, seed=0)


def test_local_update_moves_the_weights_as_the_rllib_learner(path):
    learner = _learner(path)
    hf = learner.module[DEFAULT_MODULE_ID].model
    model = copy.deepcopy(hf)
    before = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    batch = _batch()
    theirs = _learner_update(learner, batch)
    ours = _local(model, learner.config).update(batch)
    assert theirs["num_optimizer_steps"] == ours["num_optimizer_steps"] == 6  # 2 epochs x 3 mini-batches
    step = max(float((v - before[k]).abs().max()) for k, v in hf.state_dict().items())
    diff = max(float((v - hf.state_dict()[k]).abs().max()) for k, v in model.state_dict().items())
    print(f"\nmax |weight step| {step:.3g}, max |LocalUpdate - learner| {diff:.3g}")
    assert step > 1e-4  # the update moved the weights ...
    assert diff < 1e-3 * step  # ... and both moved them alike (float rounding of the clip only)
    # every metric of the update (Clip-Cov's random picks and the entropy sample: the learner's
    # rank-0 streams), grad_norm (the mean over the steps) included
    assert {"total_loss", "pg_loss", "sil_pg_loss", "cov_fraction", "grad_norm"} <= set(ours) <= set(theirs)
    for k, v in ours.items():
        assert v == pytest.approx(theirs[k], rel=1e-5, abs=1e-7), k


def test_local_update_draws_from_the_learners_rank0_streams():
    local = update_core.LocalUpdate(torch.nn.Linear(2, 2), torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1),
                                    loss_config=PolicyLossConfig(), device="cpu", seed=3,
                                    settings=update_core.UpdateSettings(micro_batch_token_budget=8))
    assert torch.equal(local.cov_generator.get_state(), seeded_generator(3, "cov_rng", 0).get_state())
    assert torch.equal(local.entropy_generator.get_state(), seeded_generator(3, "entropy_rng", 0).get_state())


def test_the_rllib_learner_updates_through_one_core_call(path, monkeypatch):
    """One ``UpdateCore.update`` per learner update, and no RLlib hook inside it: the core never
    calls back into the learner (no adapter <-> core crossing per micro-batch)."""
    calls = {"update": 0, "loss": 0}

    def count(name, real):
        def wrapped(*a, **kw):
            calls[name] += 1
            return real(*a, **kw)
        return wrapped

    for name in calls:
        monkeypatch.setattr(update_core.UpdateCore, name, count(name, getattr(update_core.UpdateCore, name)))

    def refuse(name):
        def hook(*a, **kw):
            raise AssertionError(f"the update called RLlib's {name}")
        return hook

    for owner, name in ((Learner, "compute_losses"), (TorchLearner, "compute_gradients"),
                        (Learner, "postprocess_gradients"), (TorchLearner, "apply_gradients")):
        monkeypatch.setattr(owner, name, refuse(name))
    _learner_update(_learner(path), _batch())
    assert calls["update"] == 1 and calls["loss"] >= 6  # >= one micro-batch per step


def test_non_finite_norm_skips_the_step():
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.tensor([1.0, float("nan"), 2.0])
    opt = torch.optim.SGD([p], lr=0.1)
    norm = steps.clip_sharded_grads({p: p.grad}, 1.0)
    assert math.isnan(norm) and torch.isnan(p.grad[1])  # nothing clipped
    steps.step_optimizers([opt], math.isfinite(norm))
    assert p.grad is None and torch.equal(p.detach(), torch.ones(3))  # dropped, weights kept


def test_clip_by_global_norm_and_refuse_other_modes_sharded():
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.tensor([3.0, 4.0])
    assert steps.clip_sharded_grads({p: p.grad}, 1.0) == 5.0  # the norm before clipping
    assert torch.allclose(p.grad, torch.tensor([0.6, 0.8]), atol=1e-6)
    with pytest.raises(ValueError, match="global_norm"):
        steps.clip_sharded_grads({p: p.grad}, 1.0, "value")


@pytest.mark.parametrize("clip_by", ["global_norm", "norm", "value"])
def test_the_replicated_clip_is_rllibs_to_the_bit(clip_by):
    """``steps.ReplicatedClip`` clips as RLlib's ``clip_gradients`` does (the learner's replicated
    step was RLlib's before the core owned it), and reports RLlib's global norm."""
    from ray.rllib.utils.torch_utils import clip_gradients

    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(5, 3)) for _ in range(3)]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    for a, b in zip(ours, theirs):
        a.grad = torch.randn_like(a) * 3
        b.grad = a.grad.clone()
    opt = torch.optim.SGD(ours, lr=0.1)
    norms = steps.ReplicatedClip(0.5, clip_by)({"default_optimizer": opt}, {p: p.grad for p in ours})
    grads = {b: b.grad for b in theirs}
    norm = clip_gradients(grads, grad_clip=0.5, grad_clip_by=clip_by)
    for a, b in zip(ours, theirs):
        assert torch.equal(a.grad, grads[b])
    if clip_by == "global_norm":
        assert torch.equal(norms.optimizer_norms["default_optimizer"], norm)
    else:
        assert norms.optimizer_norms == {}
