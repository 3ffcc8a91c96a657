"""Self-imitation learning (SPEAR, docs/algorithms.md 2.2-2.3) as a feature any algorithm can
switch on with ``.training(sil_enabled=True)``.

Order within iteration t: (a) ``replay_rows(t)`` samples the buffer before this step's batch is
added, with loss weight ``sil_weight(t)``; (b)+(c) ``admit`` evicts stale entries, records the
group baselines and admits this step's positive-advantage trajectories.

The buffer is an RLlib replay buffer built from ``replay_buffer_config`` (``recipe/sil_spec.py``;
docs/algorithms.md 2.6), and only RLlib's interface is called on it: ``sample(step=t)`` for (a),
``add(SILBatch)`` for (b)+(c), ``get_state`` / ``set_state`` for checkpoints (when
``store_buffer_in_checkpoints``), and ``metrics()`` when the buffer has one.
"""
from __future__ import annotations

import logging
import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.advantages import group_reward_stats
from ..core.schedules import sil_weight
from ..core.trajectory import Trajectory
from .batching import LearnerRow
from .estimators import step_rows
from .piece import ErrorFn, check_choice, check_ints, check_numbers
from .sil_buffer import SILBatch, SILReplayBuffer
from .sil_spec import DEFAULT_REPLAY_BUFFER_CONFIG, build_sil_buffer, check_replay_buffer_config

__all__ = ["SIL_DEFAULTS", "validate_sil", "SelfImitation", "ReplayPlan"]

logger = logging.getLogger(__name__)

SIL_DEFAULTS: dict[str, Any] = {
    # 2.2 replay buffer; 2.6: replay_buffer_config builds it, the sil_* keys fill what it leaves out
    "sil_enabled": False,
    "replay_buffer_config": dict(DEFAULT_REPLAY_BUFFER_CONFIG),
    "store_buffer_in_checkpoints": True,  # RLlib's key (DQN's default is False)
    "sil_capacity": 2048,
    "sil_tolerate_steps": 5,
    "sil_baseline_buffer_size": 10240,
    "sil_trigger": "burst",  # "burst" | "continuous"
    "sil_replay_batch_size": 64,  # continuous mode
    "sil_min_replay_size": 1,
    "sil_require_tool_call": False,
    "sil_keep_zero": True,  # agent: keep A~ >= 0; math: > 0
    "sil_std_normalize": False,
    # what admission reads (2.2): "episode" (A_i = R_i - mean_g R > 0, the papers and the verl
    # tree) or "step" (each step whose step-level advantage, GiGPO's combined one, is > 0; the
    # released agent tree's hybrid trainer admits step rows so); the group means and stds of the
    # baseline follow group_stats_over
    "sil_admission": "episode",
    # 2.3 SIL loss weight and combination
    "sil_update": "sequential",  # "sequential" (released) | "joint" (paper)
    "sil_kappa": 1.0,
    "sil_weight_steps": 200,  # T_SIL
    # 1.4 Clip-Cov for replayed data (agent code)
    "replay_clip_cov_ratio": 0.02,
    "replay_clip_cov_lb": 2.0,
    "replay_clip_cov_ub": 60.0,
}


def validate_sil(cfg: Any, err: ErrorFn) -> None:
    """The SIL knobs (checked whether or not SIL is on: a bad value is a bad value)."""
    check_choice(cfg, err, "sil_trigger", ("burst", "continuous"))
    check_choice(cfg, err, "sil_update", ("sequential", "joint"))
    check_choice(cfg, err, "sil_admission", ("episode", "step"))
    if not (0 <= cfg.sil_tolerate_steps <= 10):
        err(f"`sil_tolerate_steps` must be in [0, 10] (the released code clamps at 10), got {cfg.sil_tolerate_steps!r}")
    check_ints(cfg, err, ("sil_weight_steps", "sil_capacity", "sil_baseline_buffer_size", "sil_replay_batch_size"), 1)
    check_numbers(cfg, err, ("sil_kappa",))
    check_replay_buffer_config(cfg, err)


def _admit_steps(trajs: list[Trajectory], step_adv: list[np.ndarray] | None,
                 masked_steps: list[list[int]] | None = None) -> tuple[list[Trajectory], list[float]]:
    """``sil_admission="step"``: a copy of each trajectory that records its steps of positive
    step advantage (``derived["sil_steps"]``), those a filter masked (``masked_steps``) left
    out, and as its admission value the largest of them (> 0 exactly when some step is admitted)."""
    if step_adv is None:
        raise ValueError("sil_admission='step' admits steps by their step advantage, which this advantage "
                         "estimator does not give: use advantage_estimator='gigpo' (or 'spa'), or "
                         "sil_admission='episode'")
    out, values = [], []
    masked = masked_steps if masked_steps is not None else [[] for _ in trajs]
    for t, a, off in zip(trajs, step_adv, masked):
        pos = [k for k, x in enumerate(np.asarray(a, np.float64)) if x > 0.0 and k not in off]
        copy = Trajectory.from_dict(t.to_dict())
        copy.derived["sil_steps"] = pos
        out.append(copy)
        values.append(float(max(a[k] for k in pos)) if pos else 0.0)
    return out, values


def _replay_mask(t: Trajectory) -> np.ndarray:
    """The loss mask of a replayed trajectory: all its assistant tokens, or those of the steps
    it was admitted with (``derived["sil_steps"]``, ``sil_admission="step"``)."""
    mask = t.loss_mask()
    steps = t.derived.get("sil_steps")
    if steps is None:
        return mask
    return mask * np.isin(t.token_steps(), np.asarray(steps, np.int64)).astype(np.float32)


@dataclass
class ReplayPlan:
    """Replayed rows of this step, their loss weight, and whether they join the on-policy update
    (``sil_update="joint"``) or get their own optimizer steps after it (``"sequential"``)."""

    rows: list[LearnerRow]
    weight: float
    joint: bool


class SelfImitation:
    """The SIL buffer plus its schedule; state is checkpointed with the algorithm."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        #: built from replay_buffer_config (the algorithm holds it as ``local_replay_buffer``)
        self.buffer = build_sil_buffer(cfg)

    def replay_rows(self, step: int) -> ReplayPlan:
        """(a): sample before this step's batch is added; w_SIL(t) = sil_weight(t) (2.3)."""
        w = sil_weight(step, self.cfg.sil_kappa, self.cfg.sil_weight_steps)
        rows = [LearnerRow(t, t.token_advantages(a), _replay_mask(t), is_replay=True, loss_weight=w)
                for t, a in self._replay(step)]
        return ReplayPlan(rows, w, self.cfg.sil_update == "joint")

    def _replay(self, step: int) -> list[tuple[Trajectory, float]]:
        """``buffer.sample(step=step)``, checked: a user buffer that breaks the contract is named."""
        out = self.buffer.sample(step=step)
        pairs = []
        for item in out if isinstance(out, (list, tuple)) else [out]:
            ok = isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], Trajectory)
            a = item[1] if ok else None
            if not ok or isinstance(a, bool) or not isinstance(a, numbers.Real) or not math.isfinite(a):
                raise TypeError(f"{type(self.buffer).__name__}.sample(step={step}) must return a list of "
                                f"(Trajectory, finite float A~) pairs (docs/algorithms.md 2.6), got {item!r:.200}")
            pairs.append((item[0], float(a)))
        return pairs

    def admit(self, trajs: list[Trajectory], episode_adv: np.ndarray, filtered: list[bool],
              step: int, step_adv: list[np.ndarray] | None = None,
              masked_steps: list[list[int]] | None = None) -> dict[str, float]:
        """(b)+(c): evict stale entries, record baselines, admit positive-advantage trajectories.

        The baseline's group statistics are over trajectories, or over step rows (a trajectory
        of K steps counts K times) with ``group_stats_over="steps"``. With
        ``sil_admission="step"`` a trajectory is admitted with the steps whose step advantage
        (``step_adv``) is > 0, and only those steps are replayed (``derived["sil_steps"]``).

        ``filtered``: trajectories a response filter masked (never admitted); ``masked_steps``
        (``filter_scope="step"``): the steps a filter masked in the others. Step admission leaves
        those steps out and admits the rest, as the released agent tree, where a masked step
        sample has advantage 0 and only positive rows enter the buffer; episode admission
        admits no trajectory with a masked step."""
        if self.cfg.sil_admission == "step" and masked_steps is not None:
            filtered = [f and not m for f, m in zip(filtered, masked_steps)]  # masked whole only
        weights = None
        if getattr(self.cfg, "group_stats_over", "trajectories") == "steps":
            weights = [step_rows(t) for t in trajs]
        stats = group_reward_stats([t.total_reward for t in trajs], [t.uid for t in trajs], weights=weights)
        if self.cfg.sil_admission == "step":
            trajs, episode_adv = _admit_steps(trajs, step_adv, masked_steps)
        self.buffer.add(SILBatch(trajs, [float(a) for a in episode_adv], step,
                                 group_means=[v[0] for v in stats.values()],
                                 group_stds=[v[1] for v in stats.values()], loss_masks_zeroed=filtered))
        # metrics() is optional for a user buffer: without it, its size is logged
        has_metrics = callable(getattr(self.buffer, "metrics", None))
        metrics = self.buffer.metrics() if has_metrics else {"size": len(self.buffer)}
        return {f"sil_{k}": float(v) for k, v in metrics.items()}

    def get_state(self) -> dict[str, Any] | None:
        """The buffer's state, or None with ``store_buffer_in_checkpoints=False`` (RLlib's key)."""
        return self.buffer.get_state() if self.cfg.store_buffer_in_checkpoints else None

    def set_state(self, state: dict[str, Any] | None) -> None:
        """Restore the buffer as RLlib documents ``store_buffer_in_checkpoints``: restored only
        when True; a warning when True and the checkpoint holds no buffer, or False and it does
        (the buffer is then left as it is)."""
        store = self.cfg.store_buffer_in_checkpoints
        if not store or state is None:
            if store or state is not None:
                logger.warning(
                    "`store_buffer_in_checkpoints` is %s, but the checkpoint %s a SIL replay buffer: the buffer is "
                    "left as it is", store, "holds no" if store else "holds")
            return
        if isinstance(self.buffer, SILReplayBuffer):
            # the running config (sil_capacity, sil_trigger, ...) wins over the checkpoint's
            self.buffer.set_state(state, keep_config=True)
        else:
            self.buffer.set_state(state)
