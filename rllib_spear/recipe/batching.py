"""Driver-side construction of learner batches (no Ray): shard whole groups over learners,
assign mini-batches, compute the global loss normalizers, pad."""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import numpy as np
import torch

from ..core.losses import loss_normalizer
from ..core.trajectory import Trajectory, collate_trajectories

__all__ = ["LearnerRow", "build_learner_batches"]


class LearnerRow:
    """One trajectory prepared for the learner."""

    __slots__ = ("traj", "advantages", "loss_mask", "is_replay", "loss_weight", "old_logp")

    def __init__(self, traj: Trajectory, advantages: np.ndarray, loss_mask: np.ndarray,
                 is_replay: bool = False, loss_weight: float = 1.0,
                 old_logp: np.ndarray | None = None) -> None:
        self.traj, self.advantages, self.loss_mask = traj, advantages, loss_mask
        self.is_replay, self.loss_weight, self.old_logp = is_replay, loss_weight, old_logp


def build_learner_batches(
    rows: Sequence[LearnerRow],
    *,
    num_learners: int,
    minibatch_size: int | None,
    t_norm: float,
    pad_token_id: int,
    seed: int = 0,
) -> list[dict[str, np.ndarray]]:
    """Columns (numpy) of one batch per learner (``max(num_learners, 1)`` batches).

    Groups (same uid) stay together on one learner. Mini-batches: rows are shuffled by group
    (seeded) and cut into chunks of ``minibatch_size`` trajectories; each chunk is one optimizer
    step on every learner. Normalizers (token count, non-empty sequence count) are computed per
    (mini-batch, on-policy|replay) over the whole global batch and written on each row.
    """
    if not rows:
        raise ValueError("build_learner_batches: rows is empty")
    n_shards = max(1, num_learners)
    # --- mini-batch ids, whole groups kept together where sizes allow
    by_uid: dict[tuple[str, bool], list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        by_uid[(r.traj.uid, r.is_replay)].append(i)
    groups = list(by_uid.values())
    rng = np.random.default_rng(seed)
    order = [i for g in (groups[j] for j in rng.permutation(len(groups))) for i in g]
    mb_size = len(rows) if not minibatch_size else int(minibatch_size)
    num_mb = max(1, int(np.ceil(len(rows) / mb_size)))
    minibatch_id = np.zeros(len(rows), np.int64)
    for pos, i in enumerate(order):
        minibatch_id[i] = min(pos // mb_size, num_mb - 1)
    # --- global normalizers per (mini-batch, replay flag)
    norms: dict[tuple[int, bool], tuple[float, float]] = {}
    for mb in range(num_mb):
        for rep in (False, True):
            idx = [i for i in range(len(rows)) if minibatch_id[i] == mb and rows[i].is_replay == rep]
            if not idx:
                continue
            L = max(rows[i].loss_mask.shape[0] for i in idx)
            m = torch.zeros(len(idx), L)
            for k, i in enumerate(idx):
                m[k, : rows[i].loss_mask.shape[0]] = torch.from_numpy(rows[i].loss_mask)
            nz = loss_normalizer(m, t_norm)
            norms[(mb, rep)] = (max(float(nz.num_tokens), 1.0), max(float(nz.num_seqs), 1.0))
    # --- shard groups over learners, balancing tokens
    shard_rows: list[list[int]] = [[] for _ in range(n_shards)]
    shard_tokens = [0] * n_shards
    for g in sorted(groups, key=lambda g: -sum(rows[i].traj.length for i in g)):
        s = int(np.argmin(shard_tokens))
        shard_rows[s].extend(g)
        shard_tokens[s] += sum(rows[i].traj.length for i in g)
    out = []
    for idx in shard_rows:
        if not idx:  # more learners than groups: a fully masked copy keeps DDP in lockstep
            idx = [0]
            dummy = True
        else:
            dummy = False
        sel = [rows[i] for i in idx]
        tb = collate_trajectories(
            [r.traj for r in sel], advantages=[r.advantages for r in sel],
            pad_token_id=pad_token_id, loss_masks=[r.loss_mask * (0.0 if dummy else 1.0) for r in sel],
        )
        engine_logp = tb.old_logprobs.numpy()
        old = engine_logp.copy()
        for k, r in enumerate(sel):
            if r.old_logp is not None:
                old[k, : len(r.old_logp)] = r.old_logp * tb.loss_mask[k, : len(r.old_logp)].numpy()
        cols = {
            "input_ids": tb.input_ids.numpy(),
            "attention_mask": tb.attention_mask.numpy(),
            "loss_mask": tb.loss_mask.numpy(),
            "old_logp": old,
            "engine_logp": engine_logp,
            "advantages": tb.advantages.numpy(),
            "minibatch_id": minibatch_id[idx],
            "num_minibatches": np.full(len(idx), num_mb, np.int64),
            "norm_num_tokens": np.array([norms.get((minibatch_id[i], rows[i].is_replay), (1.0, 1.0))[0] for i in idx], np.float32),
            "norm_num_seqs": np.array([norms.get((minibatch_id[i], rows[i].is_replay), (1.0, 1.0))[1] for i in idx], np.float32),
            "t_norm": np.full(len(idx), t_norm, np.float32),
            "is_replay": np.array([r.is_replay for r in sel], np.float32),
            "loss_weight": np.array([r.loss_weight for r in sel], np.float32),
        }
        out.append(cols)
    return out
