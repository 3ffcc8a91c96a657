"""Self-imitation (SIL) replay buffer of SPEAR (docs/algorithms.md 2.2; the options that differ
from the released trainer are listed in 2.5), on whole :class:`Trajectory` objects.

Order of operations per training step t (``recipe/self_imitation.py`` drives it, through RLlib's
replay-buffer interface: ``sample`` = :meth:`SILReplayBuffer.sample_replay`, ``add`` =
:meth:`SILReplayBuffer.add_batch`)::

    replay = buffer.sample(step=t)        # (a) the buffer as it was BEFORE this step's batch:
                                          #     burst: if triggered -> recalibrate, sample, CLEAR
    ... on-policy update, then SIL update on ``replay`` ...
    buffer.add(SILBatch(batch, adv, t, ...))  # (b) evict stale entries (t - t_collected > tolerate),
                                          #     append this step's group means/stds to the
                                          #     baseline history and trim it
                                          # (c) add this step's candidates (A_i > 0)

Candidates need ``A_i > 0``, a loss mask not zeroed by a filter, and ``stats.tool_calls >= 1``
with ``require_tool_call``; each is stored (a copy) with ``R_i = traj.total_reward`` as
collected and its step. Recalibration: ``b = median(stored group means)``, ``s = median(stored
group stds)``, ``A~_j = R_j - b`` (or ``/ (s + 1e-6)`` with ``std_normalize``); kept ``A~_j >= 0``
(``keep_zero``) or ``> 0``. Burst trigger: ``#{j : R_j > b} > 1.5 * capacity``, then
``n = min(nearest_lower_power_of_2(#kept), capacity)`` entries are sampled uniformly without
replacement and ALL entries are cleared (also when ``n < min_replay_size`` empties the replay).
Continuous trigger: ``min(replay_batch_size, #kept)`` each call, nothing cleared.

RLlib: the class implements ``ray.rllib.utils.replay_buffers.base.ReplayBufferInterface`` (``add``,
``sample``, ``__len__``, ``get_state``, ``set_state``; docs/algorithms.md 2.6). It is registered as
a virtual subclass (``ReplayBufferInterface.register``, :func:`register_with_rllib`) rather than
inheriting, because the recipe layer imports no Ray; ``import rllib_spear`` and building the buffer
register it. Subclass it and override :meth:`SILReplayBuffer.select` to change which entries a
replay draws (the README's prioritised buffer).

Checkpoints: RLlib's new API stack does not save replay buffers in algorithm checkpoints; the
algorithm puts :meth:`SILReplayBuffer.get_state` into its own ``get_state`` and calls
:meth:`SILReplayBuffer.set_state` on restore (``store_buffer_in_checkpoints``). The state is plain
lists/dicts/floats/ints (the trajectories as ``Trajectory.to_dict``), including the numpy RNG
state, so a restored buffer draws the same future samples.

Returned trajectories are the stored objects: treat them as read-only.
"""
from __future__ import annotations

import logging
import math
import numbers
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from rllib_spear.core.advantages import group_reward_stats
from rllib_spear.core.trajectory import Trajectory

logger = logging.getLogger(__name__)

__all__ = [
    "SILReplayBuffer",
    "SILBatch",
    "register_with_rllib",
    "nearest_lower_power_of_2",
    "SIL_TRIGGERS",
    "ADV_EPS",
    "MAX_TOLERATE_STEPS",
]

SIL_TRIGGERS = ("burst", "continuous")
STALENESS_REFERENCES = ("current", "latest_entry")
BASELINE_TRIMS = ("after_append", "before_append")
ADV_EPS = 1e-6
MAX_TOLERATE_STEPS = 10
BURST_FACTOR = 1.5
_STATE_VERSION = 1


def nearest_lower_power_of_2(n: int) -> int:
    """Largest power of two ``<= n`` (0 for ``n < 1``).

    The released helper returns 0 for ``n == 1`` too; in burst mode that case cannot occur
    (a triggered buffer keeps more than ``1.5 * capacity >= 1.5`` entries).
    """
    n = int(n)
    if n < 1:
        return 0
    return 1 << (n.bit_length() - 1)


def _check_int(name: str, value: Any, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be {rng}, got {value}")
    return value


def _check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


@dataclass
class _Entry:
    trajectory: Trajectory
    ret: float
    step: int


@dataclass
class SILBatch:
    """What ``add`` receives each training step (steps (b)+(c)): the arguments of
    :meth:`SILReplayBuffer.add_batch` as one object, RLlib's ``add(batch)``.

    Attributes:
        trajectories: this step's training batch (after group filtering).
        advantages: one on-policy (outcome) advantage A_i per trajectory.
        step: the training step t (non-decreasing across calls).
        group_means / group_stds: the batch's per-group reward means / population stds (both or
            neither; neither: computed from the trajectories by uid).
        loss_masks_zeroed: True for trajectories whose loss mask a filter zeroed.
    """

    trajectories: Sequence[Trajectory]
    advantages: Sequence[float]
    step: int
    group_means: Sequence[float] | None = None
    group_stds: Sequence[float] | None = None
    loss_masks_zeroed: Sequence[bool] | None = None


class SILReplayBuffer:
    """SPEAR's self-imitation replay buffer (see the module docstring for the exact semantics), an
    RLlib ``ReplayBufferInterface`` (``add(SILBatch)``, ``sample(num_items, step=t)``).

    Args:
        capacity: ``trajectory_buffer_size``: the burst threshold is ``1.5 * capacity`` entries
            above the baseline, and a burst replays at most ``capacity`` trajectories.
        tolerate_steps: entries collected more than this many steps ago are evicted (0..10).
        baseline_buffer_size: cap on the number of stored group means in the baseline history.
        trigger: ``"burst"`` (released default) or ``"continuous"``.
        replay_batch_size: continuous mode: samples per step (None: ``capacity``).
        std_normalize: divide ``R_j - b`` by ``s + 1e-6``.
        keep_zero: keep ``A~ >= 0`` (True, agent tree) or only ``A~ > 0`` (False, math tree).
        require_tool_call: admit only trajectories with ``stats.tool_calls >= 1`` (math tree).
        min_replay_size: replay batches smaller than this are dropped (tiny-batch guard; the
            released code uses the number of GPUs).
        seed: seed of the numpy Generator used for sampling (its state is checkpointed).
        staleness_reference: ``"current"`` (project, docs/algorithms.md 2.5:
            ``t_now - t_collected``) or ``"latest_entry"`` (released ``remove_old``: step of the
            newest stored entry).
        baseline_trim: ``"after_append"`` (project: hard cap) or ``"before_append"`` (released).
    """

    def __init__(
        self,
        capacity: int = 2048,
        *,
        tolerate_steps: int = 5,
        baseline_buffer_size: int = 10240,
        trigger: str = "burst",
        replay_batch_size: int | None = None,
        std_normalize: bool = False,
        keep_zero: bool = True,
        require_tool_call: bool = False,
        min_replay_size: int = 1,
        seed: int | None = None,
        staleness_reference: str = "current",
        baseline_trim: str = "after_append",
    ) -> None:
        self.capacity = _check_int("capacity", capacity, 1)
        self.tolerate_steps = _check_int("tolerate_steps", tolerate_steps, 0, MAX_TOLERATE_STEPS)
        self.baseline_buffer_size = _check_int("baseline_buffer_size", baseline_buffer_size, 1)
        self.trigger = _check_choice("trigger", trigger, SIL_TRIGGERS)
        self.replay_batch_size = (
            None if replay_batch_size is None
            else _check_int("replay_batch_size", replay_batch_size, 1)
        )
        self.std_normalize = bool(std_normalize)
        self.keep_zero = bool(keep_zero)
        self.require_tool_call = bool(require_tool_call)
        self.min_replay_size = _check_int("min_replay_size", min_replay_size, 0)
        if seed is not None:
            seed = _check_int("seed", seed, 0)
        self.seed = seed
        self.staleness_reference = _check_choice(
            "staleness_reference", staleness_reference, STALENESS_REFERENCES)
        self.baseline_trim = _check_choice("baseline_trim", baseline_trim, BASELINE_TRIMS)

        self._rng = np.random.default_rng(seed)
        self._entries: list[_Entry] = []
        # One record per add_batch call: (step, group means, group stds).
        self._history: list[tuple[int, list[float], list[float]]] = []
        self._last_step: int | None = None
        self._counters = {"replay_events": 0, "replayed_samples": 0, "evicted_stale": 0,
                          "cleared": 0, "suppressed_replays": 0, "added": 0}
        self._last_replay_size = 0

    # ---- configuration ---------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """Constructor kwargs of this buffer (``SILReplayBuffer(**buf.config())`` rebuilds it)."""
        return {
            "capacity": self.capacity, "tolerate_steps": self.tolerate_steps,
            "baseline_buffer_size": self.baseline_buffer_size, "trigger": self.trigger,
            "replay_batch_size": self.replay_batch_size, "std_normalize": self.std_normalize,
            "keep_zero": self.keep_zero, "require_tool_call": self.require_tool_call,
            "min_replay_size": self.min_replay_size, "seed": self.seed,
            "staleness_reference": self.staleness_reference, "baseline_trim": self.baseline_trim,
        }

    # ---- RLlib's ReplayBufferInterface ------------------------------------------------------
    def add(self, batch: SILBatch, **kwargs: Any) -> None:
        """RLlib's ``add``: steps (b)+(c) for one training step (:meth:`add_batch`). ``kwargs``
        is the interface's forward-compatibility slot; SPEAR passes none."""
        if not isinstance(batch, SILBatch):
            raise TypeError(f"{type(self).__name__}.add() takes a SILBatch (trajectories, advantages, step, "
                            f"...), got {type(batch).__name__}")
        self.add_batch(batch.trajectories, batch.advantages, batch.step, group_means=batch.group_means,
                       group_stds=batch.group_stds, loss_masks_zeroed=batch.loss_masks_zeroed)

    def sample(self, num_items: int | None = None, *, step: int | None = None,
               **kwargs: Any) -> list[tuple[Trajectory, float]]:
        """RLlib's ``sample``: step (a), this step's replay ``[(trajectory, A~), ...]``
        (:meth:`sample_replay`; ``num_items`` caps it, None = the buffer's own cap). A burst
        sample empties the buffer, as in SPEAR."""
        return self.sample_replay(step, num_items)

    # ---- adding ----------------------------------------------------------------------------
    def add_batch(
        self,
        trajectories: Sequence[Trajectory],
        advantages: Sequence[float],
        step: int,
        group_means: Sequence[float] | None = None,
        group_stds: Sequence[float] | None = None,
        loss_masks_zeroed: Sequence[bool] | None = None,
    ) -> int:
        """Steps (b) and (c): evict stale entries, record the baseline stats, add candidates.

        Args:
            trajectories: this step's training batch (after group filtering).
            advantages: one on-policy (outcome) advantage A_i per trajectory.
            step: the training step t (non-decreasing across calls).
            group_means / group_stds: the batch's per-group reward means / stds (pass both or
                neither; neither: computed from ``trajectories`` by uid with
                :func:`rllib_spear.core.advantages.group_reward_stats`, population std).
            loss_masks_zeroed: True for trajectories whose loss mask a filter zeroed; they never
                enter the buffer.

        Returns:
            The number of trajectories added.
        """
        trajectories = list(trajectories)
        n = len(trajectories)
        advantages = list(advantages)
        if len(advantages) != n:
            raise ValueError(f"advantages has {len(advantages)} entries for {n} trajectories")
        adv = []
        for i, a in enumerate(advantages):
            if np.ndim(a) != 0:
                raise ValueError(f"advantages[{i}] must be a scalar, got shape {np.shape(a)}")
            adv.append(float(a))
        if loss_masks_zeroed is None:
            zeroed = [False] * n
        else:
            zeroed = [bool(z) for z in loss_masks_zeroed]
            if len(zeroed) != n:
                raise ValueError(
                    f"loss_masks_zeroed has {len(zeroed)} entries for {n} trajectories")
        step = _check_int("step", step, 0)
        if self._last_step is not None and step < self._last_step:
            raise ValueError(f"step must not decrease: got {step} after {self._last_step}")
        if (group_means is None) != (group_stds is None):
            raise ValueError("group_means and group_stds must be given together (or both None)")
        if group_means is None:
            stats = group_reward_stats([t.total_reward for t in trajectories],
                                       [t.uid for t in trajectories])
            means = [float(m) for m, _ in stats.values()]
            stds = [float(sd) for _, sd in stats.values()]
        else:
            means = [float(m) for m in group_means]
            stds = [float(s) for s in group_stds]
            if len(means) != len(stds):
                raise ValueError(
                    f"group_means has {len(means)} entries but group_stds has {len(stds)}")

        # (b) staleness eviction, then the baseline history of this step.
        self.evict_stale(step)
        self._append_history(step, means, stds)
        self._last_step = step

        # (c) candidates.
        added = 0
        for traj, a, z in zip(trajectories, adv, zeroed):
            if z or not a > 0.0:
                continue
            if self.require_tool_call and traj.require_stats("sil_require_tool_call").tool_calls < 1:
                continue
            stored = Trajectory.from_dict(traj.to_dict())  # snapshot as collected
            self._entries.append(_Entry(stored, float(traj.total_reward), step))
            added += 1
        self._counters["added"] += added
        return added

    def evict_stale(self, step: int) -> int:
        """Drop entries older than ``tolerate_steps`` (see ``staleness_reference``)."""
        if not self._entries:
            return 0
        ref = step if self.staleness_reference == "current" else self._entries[-1].step
        keep = [e for e in self._entries if abs(ref - e.step) <= self.tolerate_steps]
        evicted = len(self._entries) - len(keep)
        self._entries = keep
        self._counters["evicted_stale"] += evicted
        return evicted

    def _append_history(self, step: int, means: list[float], stds: list[float]) -> None:
        def total() -> int:
            return sum(len(m) for _, m, _ in self._history)

        if self.baseline_trim == "before_append":
            while self._history and total() > self.baseline_buffer_size:
                self._history.pop(0)
            self._history.append((step, means, stds))
        else:
            self._history.append((step, means, stds))
            while len(self._history) > 1 and total() > self.baseline_buffer_size:
                self._history.pop(0)

    # ---- recalibration ---------------------------------------------------------------------
    def baseline(self) -> tuple[float, float]:
        """``(median of all stored group means, median of all stored group stds)``; NaN if none."""
        means = [m for _, ms, _ in self._history for m in ms]
        stds = [s for _, _, ss in self._history for s in ss]
        b = float(np.median(means)) if means else math.nan
        s = float(np.median(stds)) if stds else math.nan
        return b, s

    def _recalibrate(self) -> list[tuple[_Entry, float]]:
        b, s = self.baseline()
        if math.isnan(b) or (self.std_normalize and math.isnan(s)):
            return []
        out = []
        for e in self._entries:
            a = e.ret - b
            if self.std_normalize:
                a = a / (s + ADV_EPS)
            if a > 0.0 or (self.keep_zero and a == 0.0):
                out.append((e, float(a)))
        return out

    def recalibrated(self) -> list[tuple[Trajectory, float]]:
        """Buffered trajectories with their recalibrated advantage A~, after the keep rule."""
        return [(e.trajectory, a) for e, a in self._recalibrate()]

    def num_above_baseline(self) -> int:
        """Number of buffered trajectories with ``R_j > b`` (0 without a baseline)."""
        b, _ = self.baseline()
        if math.isnan(b):
            return 0
        return sum(1 for e in self._entries if e.ret > b)

    def is_triggered(self) -> bool:
        """Burst condition: ``num_above_baseline() > 1.5 * capacity`` (strictly)."""
        return self.num_above_baseline() > BURST_FACTOR * self.capacity

    # ---- sampling --------------------------------------------------------------------------
    def sample_replay(
        self, step: int | None = None, num_items: int | None = None
    ) -> list[tuple[Trajectory, float]]:
        """Step (a): this step's replay batch, ``[(trajectory, A~), ...]`` (may be empty).

        ``step`` is informational (the buffer state alone decides). ``num_items`` overrides the
        cap (burst: ``capacity``; continuous: ``replay_batch_size``).
        """
        if num_items is not None:
            num_items = _check_int("num_items", num_items, 1)
        if self.trigger == "burst":
            if not self.is_triggered():
                self._last_replay_size = 0
                return []
            kept = self._recalibrate()
            cap = self.capacity if num_items is None else num_items
            n = min(nearest_lower_power_of_2(len(kept)), cap)
            chosen = self._draw(kept, n)
            self._counters["cleared"] += len(self._entries)
            self._entries = []
        else:
            kept = self._recalibrate()
            cap = (self.replay_batch_size or self.capacity) if num_items is None else num_items
            n = min(cap, len(kept))
            chosen = self._draw(kept, n)
        if n == 0 or n < self.min_replay_size:
            if n > 0:
                self._counters["suppressed_replays"] += 1
            self._last_replay_size = 0
            return []
        self._counters["replay_events"] += 1
        self._counters["replayed_samples"] += n
        self._last_replay_size = n
        return [(e.trajectory, a) for e, a in chosen]

    def _draw(self, kept: list[tuple[_Entry, float]], n: int) -> list[tuple[_Entry, float]]:
        if n <= 0:
            return []
        idx = [int(i) for i in self.select([(e.trajectory, a) for e, a in kept], n)]
        if len(idx) != n or len(set(idx)) != n or not all(0 <= i < len(kept) for i in idx):
            raise ValueError(f"{type(self).__name__}.select() must return {n} distinct indices into its "
                             f"{len(kept)} candidates, got {idx}")
        return [kept[i] for i in idx]

    def select(self, candidates: list[tuple[Trajectory, float]], n: int) -> Sequence[int]:
        """Indices of the ``n`` candidates ``[(trajectory, A~), ...]`` (``0 < n <= len``) that this
        replay draws: uniformly without replacement from :attr:`rng` (released). Override it to
        prioritise; draw from :attr:`rng` so that a restored run draws the same."""
        return self._rng.choice(len(candidates), size=n, replace=False)

    @property
    def rng(self) -> np.random.Generator:
        """The sampling Generator (seeded by ``seed``; its state is checkpointed)."""
        return self._rng

    def clear(self) -> None:
        """Drop all entries (the baseline history is kept, as after a burst)."""
        self._counters["cleared"] += len(self._entries)
        self._entries = []

    # ---- inspection ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    @property
    def entries(self) -> list[tuple[Trajectory, float, int]]:
        """``[(trajectory, R, step collected), ...]`` oldest first (a new list)."""
        return [(e.trajectory, e.ret, e.step) for e in self._entries]

    @property
    def baseline_history(self) -> list[tuple[int, list[float], list[float]]]:
        """``[(step, group means, group stds), ...]`` oldest first (copies)."""
        return [(t, list(m), list(s)) for t, m, s in self._history]

    def metrics(self) -> dict[str, float]:
        b, s = self.baseline()
        return {
            "size": len(self._entries),
            "num_above_baseline": self.num_above_baseline(),
            "baseline_mean": b,
            "baseline_std": s,
            "baseline_groups": sum(len(m) for _, m, _ in self._history),
            "last_replay_size": self._last_replay_size,
            **self._counters,
        }

    # ---- checkpointing ---------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """Everything needed to resume: config, entries, baseline history, RNG, counters."""
        rng_state = self._rng.bit_generator.state
        return {
            "version": _STATE_VERSION,
            "config": self.config(),
            "entries": [{"trajectory": e.trajectory.to_dict(), "return": e.ret, "step": e.step}
                        for e in self._entries],
            "baseline_history": [{"step": t, "means": list(m), "stds": list(s)}
                                 for t, m, s in self._history],
            "last_step": self._last_step,
            "rng": _plain(rng_state),
            "counters": dict(self._counters),
            "last_replay_size": self._last_replay_size,
        }

    def set_state(self, state: dict[str, Any], *, keep_config: bool = False) -> None:
        """Restore :meth:`get_state` output: entries, baseline history, RNG, counters and, unless
        ``keep_config``, the checkpoint's configuration. ``keep_config=True`` (what a restored
        training run does) keeps this buffer's configuration, the one the user runs with now, and
        logs a warning naming every setting that differs from the checkpoint's."""
        version = state.get("version")
        if version != _STATE_VERSION:
            raise ValueError(f"state version must be {_STATE_VERSION}, got {version!r}")
        if keep_config:
            running = self.config()
            # the seed only seeds a fresh RNG; the checkpoint's RNG state is restored below
            changed = {k: (v, running[k]) for k, v in state["config"].items()
                       if k != "seed" and k in running and running[k] != v}
            if changed:
                logger.warning("SIL buffer restored with the running configuration, not the checkpoint's: %s",
                               ", ".join(f"{k}: checkpoint {a!r} -> running {b!r}" for k, (a, b) in changed.items()))
            self.__init__(**running)
        else:
            self.__init__(**state["config"])
        self._entries = [
            _Entry(Trajectory.from_dict(d["trajectory"]), float(d["return"]), int(d["step"]))
            for d in state["entries"]
        ]
        self._history = [(int(h["step"]), [float(x) for x in h["means"]],
                          [float(x) for x in h["stds"]]) for h in state["baseline_history"]]
        self._last_step = None if state["last_step"] is None else int(state["last_step"])
        rng_state = state["rng"]
        bitgen = getattr(np.random, rng_state["bit_generator"])()
        bitgen.state = rng_state
        self._rng = np.random.Generator(bitgen)
        self._counters.update({k: int(v) for k, v in state["counters"].items()})
        self._last_replay_size = int(state.get("last_replay_size", 0))


def _plain(x: Any) -> Any:
    """Deep copy of nested dicts/lists into plain Python types."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    return x


def register_with_rllib() -> bool:
    """Make :class:`SILReplayBuffer` (and every subclass) a virtual subclass of RLlib's
    ``ReplayBufferInterface``; False without Ray. Idempotent. Not done at import: the recipe layer
    imports no Ray (``rllib_spear.algorithms.spear`` and the SIL builder call it)."""
    try:
        from ray.rllib.utils.replay_buffers.base import ReplayBufferInterface
    except ImportError:
        return False
    if not issubclass(SILReplayBuffer, ReplayBufferInterface):
        ReplayBufferInterface.register(SILReplayBuffer)
    return True
