"""Driver-side construction of learner batches (no Ray): shard whole groups over learners,
assign mini-batches, compute the global loss normalizers, pad."""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import numpy as np
import torch

from ..core.losses import LossNormalizer, loss_normalizer
from ..core.step_samples import step_samples
from ..core.trajectory import Trajectory, collate_trajectories

__all__ = ["LearnerRow", "build_learner_batches", "epoch_minibatch_ids", "expand_step_rows"]


class LearnerRow:
    """One trajectory prepared for the learner."""

    __slots__ = ("traj", "advantages", "loss_mask", "is_replay", "loss_weight", "old_logp")

    def __init__(self, traj: Trajectory, advantages: np.ndarray, loss_mask: np.ndarray,
                 is_replay: bool = False, loss_weight: float = 1.0,
                 old_logp: np.ndarray | None = None) -> None:
        self.traj, self.advantages, self.loss_mask = traj, advantages, loss_mask
        self.is_replay, self.loss_weight, self.old_logp = is_replay, loss_weight, old_logp


def expand_step_rows(rows: Sequence[LearnerRow]) -> list[LearnerRow]:
    """One row per learner sample: a window-layout episode (``Trajectory.step_prompts``) becomes
    one row per step (``core.step_samples.step_samples``: its window prompt and its action, the
    episode's arrays sliced there), keeping the row's ``is_replay`` and ``loss_weight``; a
    full-layout row stays as it is (docs/design.md "Sample layouts: full and window")."""
    out: list[LearnerRow] = []
    for r in rows:
        if r.traj.step_prompts is None:
            out.append(r)
            continue
        for traj, adv, mask, old in step_samples(r.traj, r.advantages, r.loss_mask, r.old_logp):
            out.append(LearnerRow(traj, adv, mask, is_replay=r.is_replay, loss_weight=r.loss_weight, old_logp=old))
    return out


def _groups(rows: Sequence[LearnerRow]) -> list[list[int]]:
    """Row indices by group (same uid and on-policy / replay flag), in first-seen order."""
    by_uid: dict[tuple[str, bool], list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        by_uid[(r.traj.uid, r.is_replay)].append(i)
    return list(by_uid.values())


def epoch_minibatch_ids(groups: Sequence[Sequence[int]], num_rows: int, minibatch_size: int | None,
                        num_epochs: int, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """``([num_rows, num_epochs] mini-batch id, mini-batches per epoch)``.

    Per epoch e the groups are put in a fresh random order (``rng.permutation``, drawn epoch by
    epoch, so epoch 0 is the single-epoch shuffle of the same seed) and the rows, group by
    group, cut into chunks of ``minibatch_size``: ``id[i, e] = min(pos_e(i) // size, n_mb - 1)``
    with ``n_mb = ceil(num_rows / size)`` (None = one mini-batch, the whole batch).
    """
    size = num_rows if not minibatch_size else int(minibatch_size)
    num_mb = max(1, int(np.ceil(num_rows / size)))
    ids = np.zeros((num_rows, num_epochs), np.int64)
    for e in range(num_epochs):
        order = [i for j in rng.permutation(len(groups)) for i in groups[j]]
        for pos, i in enumerate(order):
            ids[i, e] = min(pos // size, num_mb - 1)
    return ids, num_mb


def _normalizers(rows: Sequence[LearnerRow], minibatch_ids: np.ndarray,
                 t_norm: float) -> dict[tuple[int, int, bool], tuple[float, float]]:
    """Global normalizers ``(num_tokens, num_seqs)`` per (epoch, mini-batch, replay?): the counts
    of the rows in that part (both are sums over rows, so each row is counted once and the
    counts are merged), each at least 1."""
    per_row = [loss_normalizer(torch.from_numpy(np.asarray(r.loss_mask, np.float32))[None], t_norm) for r in rows]
    parts: dict[tuple[int, int, bool], list[LossNormalizer]] = defaultdict(list)
    for i, r in enumerate(rows):
        for e, mb in enumerate(minibatch_ids[i]):
            parts[(e, int(mb), bool(r.is_replay))].append(per_row[i])
    out = {}
    for key, norms in parts.items():
        nz = LossNormalizer.merge(norms)
        out[key] = (max(nz.num_tokens, 1.0), max(nz.num_seqs, 1.0))
    return out


def build_learner_batches(
    rows: Sequence[LearnerRow],
    *,
    num_learners: int,
    minibatch_size: int | None,
    t_norm: float,
    pad_token_id: int,
    seed: int = 0,
    num_epochs: int = 1,
) -> list[dict[str, np.ndarray]]:
    """Columns (numpy) of one batch per learner (``max(num_learners, 1)`` batches).

    Groups (same uid) stay together on one learner. Mini-batches (``epoch_minibatch_ids``): per
    epoch, rows are shuffled by group (seeded; a fresh shuffle each epoch) and cut into chunks
    of ``minibatch_size`` trajectories; each chunk is one optimizer step on every learner, so an
    update makes ``num_epochs x num_minibatches`` steps (PPO epochs). Normalizers (token count,
    non-empty sequence count) are computed per (epoch, mini-batch, on-policy|replay) over the
    whole global batch and written on each row. The per-epoch columns ``minibatch_id``,
    ``norm_num_tokens`` and ``norm_num_seqs`` are [B, num_epochs].

    Rows are learner samples: window-layout episodes are expanded first into one row per step
    (:func:`expand_step_rows`), so ``minibatch_size``, the normalizers (a step sample is one
    sequence) and the grouping by uid (an episode's steps share its task's uid) count samples.
    """
    if not rows:
        raise ValueError("build_learner_batches: rows is empty")
    rows = expand_step_rows(rows)
    if isinstance(num_epochs, bool) or not isinstance(num_epochs, (int, np.integer)) or num_epochs < 1:
        raise ValueError(f"build_learner_batches: num_epochs must be an int >= 1, got {num_epochs!r}")
    n_shards = max(1, num_learners)
    groups = _groups(rows)
    minibatch_id, num_mb = epoch_minibatch_ids(groups, len(rows), minibatch_size, int(num_epochs),
                                               np.random.default_rng(seed))
    norms = _normalizers(rows, minibatch_id, t_norm)
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
            "minibatch_id": minibatch_id[idx],  # [B, num_epochs]
            "num_minibatches": np.full(len(idx), num_mb, np.int64),  # per epoch
            "norm_num_tokens": _norm_column(norms, minibatch_id, rows, idx, 0),
            "norm_num_seqs": _norm_column(norms, minibatch_id, rows, idx, 1),
            "t_norm": np.full(len(idx), t_norm, np.float32),
            "is_replay": np.array([r.is_replay for r in sel], np.float32),
            "loss_weight": np.array([r.loss_weight for r in sel], np.float32),
        }
        out.append(cols)
    return out


def _norm_column(norms: dict, minibatch_id: np.ndarray, rows: Sequence[LearnerRow], idx: Sequence[int],
                 which: int) -> np.ndarray:
    """[len(idx), num_epochs] float32: entry ``which`` (0 tokens, 1 sequences) of each row's
    normalizer in each epoch."""
    return np.array([[norms[(e, int(mb), bool(rows[i].is_replay))][which] for e, mb in enumerate(minibatch_id[i])]
                     for i in idx], np.float32).reshape(len(idx), minibatch_id.shape[1])
