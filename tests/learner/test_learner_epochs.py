"""PPO epochs of the learner (``num_epochs``) and its loss metrics under micro-batching (a local
learner on the tiny model, no Ray)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

from rllib_spear import GRPOConfig
from rllib_spear.learner import core as core_mod
from rllib_spear.learner import loss as loss_mod
from rllib_spear.core.losses import loss_normalizer, policy_loss
from rllib_spear.core.trajectory import Segment, Trajectory
from rllib_spear.models.logprobs import naive_token_logprobs
from rllib_spear.recipe.batching import LearnerRow, build_learner_batches


@pytest.fixture(scope="module")
def path():
    from rllib_spear.models.factory import tiny_model_path

    return tiny_model_path()


def _rows(masked_row: bool = False, logp_jitter: float = 0.0) -> list[LearnerRow]:
    """4 two-turn trajectories in 2 groups (+ with ``masked_row`` a 5th, group of its own, whose
    loss mask is all 0, e.g. filtered). Behaviour log-probs -1.0: the first ratio is not 1
    (``logp_jitter``: plus seeded uniform noise of that size, as another batch's rounding)."""
    rng = np.random.default_rng(0)
    jitter = np.random.default_rng(1)
    lp = lambda k: (-1.0 + logp_jitter * jitter.uniform(-1, 1, k)).tolist()  # noqa: E731
    rows = []
    for i in range(5 if masked_row else 4):
        tok = lambda k: rng.integers(3, 500, k).tolist()  # noqa: E731
        segs = [Segment("prompt", tok(6 + i)), Segment("assistant", tok(5), lp(5), 0),
                Segment("observation", tok(4)), Segment("assistant", tok(3 + i), lp(3 + i), 1)]
        t = Trajectory(uid=f"g{i // 2}", segments=segs, outcome_reward=float(i % 2), step_rewards=[0.0, 0.0],
                       traj_id=f"t{i}")
        mask = t.loss_mask() * (0.0 if i == 4 else 1.0)
        rows.append(LearnerRow(t, t.token_advantages(0.5 if i % 2 else -0.5), mask))
    return rows


def _learner(path, **training):
    training.setdefault("micro_batch_token_budget", 48)  # 2+ micro-batches
    cfg = (GRPOConfig().environment("search_qa").env_runners(num_env_runners=0)
           .training(lr=1e-4, **training)
           .rl_module(model_config={"model_path": path}).debugging(seed=0))
    return cfg.build_learner(env=None)


def _update(learner, rows, *, num_epochs=1, minibatch_size=None, seed=0):
    batch = build_learner_batches(rows, num_learners=0, minibatch_size=minibatch_size, t_norm=64.0,
                                  pad_token_id=0, seed=seed, num_epochs=num_epochs)[0]
    mab = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(dict(batch))}, env_steps=len(batch["input_ids"]))
    res = learner.update(batch=mab, timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 1})
    res = res[0] if isinstance(res, list) else res
    peek = lambda v: v.peek() if hasattr(v, "peek") else v  # noqa: E731
    return batch, {k: float(peek(v)) for k, v in res[DEFAULT_MODULE_ID].items() if np.ndim(peek(v)) == 0}


def _weights(learner) -> dict:
    return {k: v.detach().clone() for k, v in learner.module[DEFAULT_MODULE_ID].model.state_dict().items()}


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


# ------------------------------------------------------------------- behaviour log-probs
def test_recomputed_old_logprobs_make_the_update_independent_of_engine_rounding(path):
    """Behaviour log-probs that differ by float32 rounding (1e-6: what another batch's padding
    gives the engine's forward, docs/design.md "The agent loop", Seeds) change the update, unless
    the learner recomputes them (recompute_old_logprobs=True): then the weights are bitwise equal."""
    def trained(rows, **training):
        learner = _learner(path, **training)
        _update(learner, rows)
        return _weights(learner)

    assert _max_diff(trained(_rows()), trained(_rows(logp_jitter=1e-6))) > 0
    exact = dict(recompute_old_logprobs=True)
    a, b = trained(_rows(), **exact), trained(_rows(logp_jitter=1e-6), **exact)
    assert all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------- num_epochs
def test_two_epochs_make_twice_the_steps_and_other_weights(path):
    one = _learner(path)
    _, m1 = _update(one, _rows(), num_epochs=1, minibatch_size=2)
    two = _learner(path)
    _, m2 = _update(two, _rows(), num_epochs=2, minibatch_size=2)
    assert m1["num_optimizer_steps"] == 2 and m2["num_optimizer_steps"] == 4
    assert _max_diff(_weights(one), _weights(two)) > 1e-6


def test_old_logp_is_recomputed_once_and_kept_over_epochs(path, monkeypatch):
    learner = _learner(path, recompute_old_logprobs=True, micro_batch_token_budget=10_000)  # 1 micro-batch
    recomputes, calls = [], []
    real_recompute, real_loss = core_mod.UpdateCore.recompute_old_logp, loss_mod.policy_loss

    def count_recompute(self, *a, **kw):
        recomputes.append(1)
        return real_recompute(self, *a, **kw)

    def record(logp_new, old, adv, mask, **kw):
        calls.append((logp_new.detach().clone(), old.detach().clone(), mask.clone()))
        return real_loss(logp_new, old, adv, mask, **kw)

    monkeypatch.setattr(core_mod.UpdateCore, "recompute_old_logp", count_recompute)
    monkeypatch.setattr(loss_mod, "policy_loss", record)
    _update(learner, _rows(), num_epochs=2)  # one mini-batch per epoch: 2 steps, 1 call each
    assert len(recomputes) == 1 and len(calls) == 2
    (lp1, old1, m), (lp2, old2, _) = calls
    m = m > 0
    assert torch.equal(old1, old2)  # epoch 2 scores against the same logp_old
    assert torch.allclose(torch.exp(lp1 - old1)[m], torch.ones(int(m.sum())), atol=1e-5)  # before any step
    assert float((torch.exp(lp2 - old2)[m] - 1).abs().max()) > 1e-4  # after one step: not refreshed


def test_one_epoch_whole_batch_gradient_equals_the_plain_single_pass(path):
    """num_epochs=1, minibatch_size=None: one optimizer step on the whole-batch loss, as before
    (the learner's pre-clip grad_norm equals a plain torch full-batch gradient)."""
    learner = _learner(path)
    ref = copy.deepcopy(learner.module[DEFAULT_MODULE_ID].model)
    batch, metrics = _update(learner, _rows(), num_epochs=1)
    assert metrics["num_optimizer_steps"] == 1

    t = {k: torch.as_tensor(v) for k, v in batch.items()}
    logp = naive_token_logprobs(ref, t["input_ids"].long(), t["attention_mask"].long())
    mask = t["loss_mask"].float()
    norm = loss_normalizer(mask, 64.0)
    loss, _ = policy_loss(logp, t["old_logp"].float(), t["advantages"].float(), mask,
                          config=learner.config.policy_loss_config(), normalizer=norm)
    loss.backward()
    grad_norm = float(torch.nn.utils.get_total_norm([p.grad for p in ref.parameters() if p.grad is not None]))
    assert metrics["grad_norm"] == pytest.approx(grad_norm, rel=1e-5)
    assert metrics["total_loss"] == pytest.approx(float(loss.detach()), abs=1e-6)


# ------------------------------------------------------------------------------- loss metrics
_SAME = ("loss", "pg_loss", "num_tokens", "num_seqs", "ratio_mean", "ratio_max", "ratio_min", "approx_kl",
         "total_loss", "entropy")


@pytest.mark.parametrize("masked_row", [False, True])
def test_loss_metrics_do_not_depend_on_the_micro_batch_split(path, masked_row):
    """Budget 8 puts every row in a micro-batch of its own (one of them, with ``masked_row``,
    without any loss token); 10_000 puts a mini-batch in one. Two mini-batches, two epochs;
    logp_old recomputed, so the ratios are near 1 (a masked part logging 0 would show)."""
    kw = dict(num_epochs=2, minibatch_size=2)
    common = dict(entropy_metric_tokens=10_000, recompute_old_logprobs=True)
    _, many = _update(_learner(path, micro_batch_token_budget=8, **common), _rows(masked_row), **kw)
    _, one = _update(_learner(path, micro_batch_token_budget=10_000, **common), _rows(masked_row), **kw)
    for k in _SAME:
        assert many[k] == pytest.approx(one[k], abs=1e-5), k
    assert one["num_tokens"] == sum(float(r.loss_mask.sum()) for r in _rows())  # the batch's loss tokens
    assert one["num_seqs"] == 4
    assert one["ratio_mean"] > 0.9 and one["ratio_min"] > 0.1  # ratios near 1: no 0 from a masked part


def test_total_loss_is_the_mean_of_the_mini_batch_losses(path):
    _, m = _update(_learner(path, micro_batch_token_budget=8), _rows(), num_epochs=1, minibatch_size=2)
    assert m["total_loss"] == pytest.approx(m["loss"], abs=1e-7)  # no replay rows: total = on-policy loss
    assert m["num_optimizer_steps"] == 2


def test_an_all_masked_micro_batch_does_not_pull_the_token_means_to_zero(path):
    """The masked row changes neither the loss nor its normalizers: every metric is the same."""
    _, base = _update(_learner(path, micro_batch_token_budget=8, recompute_old_logprobs=True), _rows())
    _, with_masked = _update(_learner(path, micro_batch_token_budget=8, recompute_old_logprobs=True),
                             _rows(masked_row=True))
    assert base["ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # one step: the ratio before it, 1
    for k in ("loss", "pg_loss", "num_tokens", "ratio_mean", "approx_kl", "ratio_min", "total_loss"):
        assert with_masked[k] == pytest.approx(base[k], abs=1e-6), k


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_validate_refuses_a_num_epochs_that_is_not_a_positive_int(bad):
    with pytest.raises(ValueError, match="num_epochs"):
        GRPOConfig().training(num_epochs=bad).validate()
    GRPOConfig().training(num_epochs=3).validate()
