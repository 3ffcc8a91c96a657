"""The learner's ratio for replayed (SIL) rows and its engine-mismatch metrics, with trainer-side
logp_old on (``tis_cap``, forced on by the vllm engine): replayed rows keep the log-probs of the
policy that generated them, and ``logp_mismatch_max`` is a maximum."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

from e2e_helpers import small_config
from rllib_spear import SPEARConfig
from rllib_spear.learner import loss as loss_mod
from rllib_spear.recipe.batching import LearnerRow, build_learner_batches
from rllib_spear.core.trajectory import Segment, Trajectory


def _traj(uid: str, tokens: list[int], logprobs: list[float]) -> Trajectory:
    return Trajectory(uid=uid, segments=[Segment("prompt", [5, 6, 7, 8]),
                                         Segment("assistant", tokens, logprobs=logprobs, step=0)],
                      outcome_reward=1.0, step_rewards=[0.0], traj_id=uid)


@pytest.fixture
def learner_and_calls(ray_session, tiny_model, monkeypatch):
    cfg = (small_config(SPEARConfig, tiny_model, tis_cap=2.0, micro_batch_token_budget=8, entropy_coeff=0.0)
           .env_runners(num_env_runners=0))
    algo = cfg.build_algo()
    calls = []
    original = loss_mod.policy_loss

    def recording(logp_new, old, adv, mask, **kw):
        calls.append({"logp": logp_new.detach().clone(), "old": old.detach().clone(), "mask": mask.clone(),
                      "engine": None if kw.get("engine_logp") is None else kw["engine_logp"].clone()})
        return original(logp_new, old, adv, mask, **kw)

    monkeypatch.setattr(loss_mod, "policy_loss", recording)
    yield algo, calls
    algo.stop()


def _update(algo, rows):
    batch = build_learner_batches(rows, num_learners=0, minibatch_size=None, t_norm=64.0,
                                  pad_token_id=algo.pad_token_id)[0]
    mab = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(batch)}, env_steps=len(batch["input_ids"]))
    return algo.learner_group.update(batch=mab, timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 1})


def _first(res, key):
    res = res[0] if isinstance(res, list) else res
    v = res[DEFAULT_MODULE_ID][key]
    return float(v.peek() if hasattr(v, "peek") else v)


def test_replayed_rows_are_scored_against_their_stored_logprobs(learner_and_calls):
    algo, calls = learner_and_calls
    stored = [-3.0, -2.5, -4.0, -3.5]  # the behaviour policy's log-probs, far from the current ones
    on = _traj("on", [20, 21, 22, 23], [-1.0] * 4)
    rep = _traj("rep", [30, 31, 32, 33], stored)
    rows = [LearnerRow(on, on.token_advantages(1.0), on.loss_mask()),
            LearnerRow(rep, rep.token_advantages(1.0), rep.loss_mask(), is_replay=True, loss_weight=1.0)]
    _update(algo, rows)
    # the first policy_loss calls of the update run before any optimizer step
    replay_calls = [c for c in calls if c["engine"] is None]
    on_calls = [c for c in calls if c["engine"] is not None]
    assert replay_calls and on_calls
    c = replay_calls[0]
    m = c["mask"] > 0
    assert int(m.sum()) == 4
    ratio = torch.exp(c["logp"] - c["old"])[m]
    assert torch.allclose(ratio, torch.exp(c["logp"][m] - torch.tensor(stored)), atol=1e-6), (c["old"][m], stored)
    assert not torch.allclose(ratio, torch.ones_like(ratio), atol=1e-2)  # not pi_theta / pi_current
    # on-policy rows: logp_old recomputed by the trainer, so the first ratio is 1
    c = on_calls[0]
    m = c["mask"] > 0
    assert torch.allclose(torch.exp(c["logp"] - c["old"])[m], torch.ones(int(m.sum())), atol=1e-5)


def test_logp_mismatch_max_is_the_maximum_over_the_update(learner_and_calls):
    algo, calls = learner_and_calls
    rng = np.random.default_rng(0)
    rows = []
    for k in range(3):  # three rows, one micro-batch each (budget 8 tokens), different mismatches
        t = _traj(f"u{k}", [40 + k, 41 + k, 42 + k, 43 + k], list(rng.uniform(-9.0, -0.5, 4)))
        rows.append(LearnerRow(t, t.token_advantages(1.0), t.loss_mask()))
    res = _update(algo, rows)
    per_call = [float((c["logp"] - c["engine"]).abs()[c["mask"] > 0].max()) for c in calls]
    assert len(per_call) == 3 and max(per_call) > min(per_call) + 0.1
    assert _first(res, "logp_mismatch_max") == pytest.approx(max(per_call), abs=1e-5)
