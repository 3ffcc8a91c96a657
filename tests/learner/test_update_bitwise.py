"""The learner's update of one batch is bitwise the same as on the tree before the learner became
its own package (Part 21): a GRPO and a SPEAR update (two epochs, two mini-batches, several
micro-batches, replay rows with their own weight) on the tiny model, hashed parameter by parameter
and metric by metric against tests/fixtures/update_bitwise.json.

The fixture was written by this file (``python tests/learner/test_update_bitwise.py --write``) on
the tree of commit c225a29. Floating-point results can differ between CPU instruction sets and
torch builds, so the comparison is bitwise where the fixture's torch version and CPU capability
are this machine's, and skipped (with the reason) elsewhere."""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "update_bitwise.json"


def _rows():
    from rllib_spear.core.trajectory import Segment, Trajectory
    from rllib_spear.recipe.batching import LearnerRow

    rng = np.random.default_rng(0)
    rows = []
    for i in range(6):
        tok = lambda k: rng.integers(3, 500, k).tolist()  # noqa: E731
        lp = lambda k: (-0.5 - rng.random(k)).tolist()  # noqa: E731
        segs = [Segment("prompt", tok(6 + i)), Segment("assistant", tok(5), lp(5), 0),
                Segment("observation", tok(4)), Segment("assistant", tok(3 + i), lp(3 + i), 1)]
        t = Trajectory(uid=f"g{i // 2}", segments=segs, outcome_reward=float(i % 2), step_rewards=[0.0, 0.0],
                       traj_id=f"t{i}")
        replay = i >= 4
        rows.append(LearnerRow(t, t.token_advantages(0.7 if i % 2 else -0.4), t.loss_mask(),
                               is_replay=replay, loss_weight=0.3 if replay else 1.0))
    return rows


def _config(algo: str, path: str):
    from rllib_spear import GRPOConfig, SPEARConfig

    cfg = SPEARConfig() if algo == "spear" else GRPOConfig()
    return (cfg.environment("search_qa").env_runners(num_env_runners=0)
            .training(lr=1e-3, micro_batch_token_budget=48, num_epochs=2)
            .rl_module(model_config={"model_path": path}).debugging(seed=0))


def update_digest(algo: str) -> dict:
    """sha256 of every parameter after one update, and the update's scalar metrics (as repr)."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

    from rllib_spear.models.factory import tiny_model_path
    from rllib_spear.recipe.batching import build_learner_batches

    torch.manual_seed(0)
    learner = _config(algo, tiny_model_path()).build_learner(env=None)
    batch = build_learner_batches(_rows(), num_learners=0, minibatch_size=4, t_norm=64.0,
                                  pad_token_id=0, seed=0, num_epochs=2)[0]
    mab = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(dict(batch))}, env_steps=len(batch["input_ids"]))
    res = learner.update(batch=mab, timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 1})
    res = res[0] if isinstance(res, list) else res
    peek = lambda v: v.peek() if hasattr(v, "peek") else v  # noqa: E731
    metrics = {k: repr(float(peek(v))) for k, v in sorted(res[DEFAULT_MODULE_ID].items())
               if np.ndim(peek(v)) == 0}
    params = {k: hashlib.sha256(v.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
              for k, v in learner.module[DEFAULT_MODULE_ID].model.state_dict().items()}
    return {"params": params, "metrics": metrics}


def _machine() -> dict:
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


@pytest.mark.parametrize("algo", ["grpo", "spear"])
def test_update_is_bitwise_unchanged(algo):
    golden = json.loads(FIXTURE.read_text())
    if golden["machine"] != _machine():
        pytest.skip(f"fixture written with {golden['machine']}, this machine is {_machine()}")
    now = update_digest(algo)
    want = golden[algo]
    assert now["params"].keys() == want["params"].keys()
    changed = [k for k in want["params"] if now["params"][k] != want["params"][k]]
    assert not changed, f"{len(changed)} parameters differ after the update, e.g. {changed[:3]}"
    # metrics added since the fixture are allowed; every metric it holds must be equal to the bit
    differ = {k: (now["metrics"].get(k), v) for k, v in want["metrics"].items() if now["metrics"].get(k) != v}
    assert not differ, differ


if __name__ == "__main__" and "--write" in sys.argv:
    FIXTURE.write_text(json.dumps({"machine": _machine(), "grpo": update_digest("grpo"),
                                   "spear": update_digest("spear")}, indent=1, sort_keys=True) + "\n")
    print("wrote", FIXTURE)
