"""The learner scores the loss tokens only, logs the entropy metric from its token sample, and
steps a fused AdamW (a local learner, no Ray)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

from rllib_spear import GRPOConfig
from rllib_spear.learner.optim import adamw_implementation
from rllib_spear.core.trajectory import Segment, Trajectory
from rllib_spear.models.logprobs import naive_token_logprobs
from rllib_spear.recipe.batching import LearnerRow, build_learner_batches


@pytest.fixture(scope="module")
def path():
    from rllib_spear.models.factory import tiny_model_path

    return tiny_model_path()


def _rows():
    """4 two-turn trajectories: prompt | assistant | observation | assistant (2 groups)."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(4):
        tok = lambda k: rng.integers(3, 500, k).tolist()  # noqa: E731
        segs = [Segment("prompt", tok(6 + i)), Segment("assistant", tok(5), [-1.0] * 5, 0),
                Segment("observation", tok(4)), Segment("assistant", tok(3 + i), [-1.0] * (3 + i), 1)]
        t = Trajectory(uid=f"g{i // 2}", segments=segs, outcome_reward=float(i % 2), step_rewards=[0.0, 0.0],
                       traj_id=f"t{i}")
        rows.append(LearnerRow(t, t.token_advantages(0.5 if i % 2 else -0.5), t.loss_mask()))
    return rows


def _update(path, **training):
    cfg = (GRPOConfig().environment("search_qa").env_runners(num_env_runners=0)
           .training(lr=1e-4, micro_batch_token_budget=48, **training)  # 2+ micro-batches
           .rl_module(model_config={"model_path": path}).debugging(seed=0))
    learner = cfg.build_learner(env=None)
    batch = build_learner_batches(_rows(), num_learners=0, minibatch_size=None, t_norm=64.0, pad_token_id=0)[0]
    mab = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(dict(batch))}, env_steps=len(batch["input_ids"]))
    res = learner.update(batch=mab, timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 1})
    res = res[0] if isinstance(res, list) else res
    out = {k: float(v.peek() if hasattr(v, "peek") else v) for k, v in res[DEFAULT_MODULE_ID].items()
           if np.ndim(v.peek() if hasattr(v, "peek") else v) == 0}
    return learner, batch, out


def _full_entropy(path, batch):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids, attn = torch.as_tensor(batch["input_ids"]), torch.as_tensor(batch["attention_mask"])
    with torch.no_grad():
        _, ent = naive_token_logprobs(model, ids, attn, return_entropy=True)
    m = torch.as_tensor(batch["loss_mask"]) > 0
    return float(ent[m].mean())


def test_entropy_metric_from_a_sample_holding_every_loss_token_is_the_full_mean(path):
    learner, batch, out = _update(path, entropy_metric_tokens=1024)  # > the 38 loss tokens
    assert out["entropy"] == pytest.approx(_full_entropy(path, batch), abs=1e-5)
    assert adamw_implementation(learner.get_optimizer()) == "fused"


def test_entropy_metric_off_and_bad_knob(path):
    _, _, out = _update(path, entropy_metric_tokens=0)
    assert "entropy" not in out and "loss" in out
    with pytest.raises(ValueError, match="entropy_metric_tokens"):
        _update(path, entropy_metric_tokens=-3)


def test_module_is_asked_for_the_loss_positions_only(path, monkeypatch):
    from rllib_spear.models import hf_policy  # the module's forward (HFCausalLMRLModule -> score_batch)

    seen = []
    real = hf_policy.token_logprobs

    def spy(*a, **kw):
        seen.append((kw.get("score_mask"), kw.get("entropy_mask"), kw.get("return_entropy")))
        return real(*a, **kw)

    monkeypatch.setattr(hf_policy, "token_logprobs", spy)
    _, batch, _ = _update(path, entropy_metric_tokens=5)
    assert seen and all(s is not None for s, _, _ in seen)
    assert sum(int(s.sum()) for s, _, _ in seen) == int((batch["loss_mask"] > 0).sum())
    assert sum(int(e.sum()) for _, e, _ in seen) == 5 and not any(r for _, _, r in seen)
