"""Two DDP learners (gloo): each rank draws its own Clip-Cov / entropy-sample stream, the learner
state that rank 0 writes holds every rank's, and a restore gives each rank back its own."""
from __future__ import annotations

import numpy as np
import torch
from ray.rllib.core import COMPONENT_LEARNER, DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

from rllib_spear import GRPOConfig
from rllib_spear.learner.state import LEARNER_STATE_KEY, seeded_generator
from rllib_spear.core.trajectory import Segment, Trajectory
from rllib_spear.recipe.batching import LearnerRow, build_learner_batches


def _rows() -> list[LearnerRow]:
    """4 groups of 2 one-turn trajectories (2 groups per learner)."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(8):
        n = 6 + i % 3
        segs = [Segment("prompt", rng.integers(3, 500, 5).tolist()),
                Segment("assistant", rng.integers(3, 500, n).tolist(), [-1.0] * n, 0)]
        t = Trajectory(uid=f"g{i // 2}", segments=segs, outcome_reward=float(i % 2), step_rewards=[0.0],
                       traj_id=f"t{i}")
        rows.append(LearnerRow(t, t.token_advantages(0.5 if i % 2 else -0.5), t.loss_mask()))
    return rows


def _update(group, seed: int) -> None:
    batches = build_learner_batches(_rows(), num_learners=2, minibatch_size=None, t_norm=16.0, pad_token_id=0,
                                    seed=seed)
    mabs = [MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(b)}, env_steps=len(b["input_ids"])) for b in batches]
    group.update(batches=mabs, timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 1})


def _rank_states(group) -> dict[int, dict]:
    def own(learner):
        import torch.distributed as dist

        return dist.get_rank(), {k: v.clone() for k, v in learner.streams.state().items()}

    res = group.foreach_learner(own)
    return dict(r.get() for r in res.result_or_errors)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])) for k in a)


def test_each_ddp_rank_checkpoints_and_restores_its_own_streams(ray_session, tiny_model, tmp_path):
    cfg = (GRPOConfig().environment("search_qa").env_runners(num_env_runners=0)
           .training(lr=1e-4, micro_batch_token_budget=64, loss_mode="clip_cov", clip_cov_ratio=0.2,
                     entropy_metric_tokens=4)
           .learners(num_learners=2, num_cpus_per_learner=0.5)
           .rl_module(model_config={"model_path": tiny_model}).debugging(seed=0))
    group = cfg.build_learner_group(env=None)
    try:
        start = _rank_states(group)
        assert sorted(start) == [0, 1]
        for r in (0, 1):  # seeded with the rank folded in
            assert _same(start[r], {s: seeded_generator(0, s, r).get_state() for s in start[r]})
        _update(group, seed=1)
        saved = _rank_states(group)
        assert not _same(saved[0], saved[1])
        assert not torch.equal(saved[1]["entropy_rng"], start[1]["entropy_rng"])  # the update drew
        state = group.get_state()  # from rank 0 alone
        in_ckpt = state[COMPONENT_LEARNER][LEARNER_STATE_KEY]["rank_rng"]
        assert sorted(in_ckpt) == [0, 1] and all(_same(in_ckpt[r], saved[r]) for r in (0, 1))
        ckpt = group.save_to_path(str(tmp_path / "learners"))

        _update(group, seed=2)  # the run goes on...
        assert not _same(_rank_states(group)[1], saved[1])
        group.restore_from_path(ckpt)  # ...and is restored: each rank gets its own streams back
        back = _rank_states(group)
        assert all(_same(back[r], saved[r]) for r in (0, 1))
    finally:
        group.shutdown()
