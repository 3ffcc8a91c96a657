"""Multi-turn trajectories and their conversion to padded training tensors.

A trajectory is a list of segments in chat order::

    prompt | assistant(step 0) | observation(step 0) | assistant(step 1) | ... | assistant(step K)

Token-in/token-out: assistant segments carry exactly the ids the engine sampled (including the
end-of-turn token) and the engine's per-token log-probs; observation segments carry the tokens of
the tool output (chat-template wrapping included), tokenized once. The loss mask is 1 exactly on
assistant tokens. A *step* is one assistant span plus the observation that follows it; step
indices count assistant segments from 0.

Per-token arrays built here are aligned with ``input_ids``: the value at position t is about
token t (its mask, its behaviour log-prob log pi(x_t | x_<t), its advantage). A learner that gets
logits from position t-1 shifts once; position 0 is always a prompt token (mask 0).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

import numpy as np
import torch

from .advantages import broadcast_step_advantages
from .episode import EpisodeStats, RolloutRecord

__all__ = ["Segment", "Trajectory", "TokenBatch", "collate_trajectories"]

SegmentKind = Literal["prompt", "assistant", "observation"]
_KINDS = ("prompt", "assistant", "observation")


@dataclass
class Segment:
    """A contiguous span of tokens of one kind.

    ``logprobs`` are the behaviour (engine) log-probs of each token; required for assistant
    segments, ignored (None) otherwise. ``step`` is the step index the span belongs to (-1 for
    the prompt). ``policy_version``: the weights version an assistant segment was sampled with
    (fully async training samples the turns of one episode on different versions: partial
    rollouts, docs/design.md "Fully asynchronous training"); None elsewhere.
    """

    kind: SegmentKind
    token_ids: list[int]
    logprobs: list[float] | None = None
    step: int = -1
    policy_version: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"Segment.kind must be one of {_KINDS}, got {self.kind!r}")
        if self.kind == "assistant":
            if self.logprobs is None:
                raise ValueError("Segment.logprobs is required for assistant segments")
            if len(self.logprobs) != len(self.token_ids):
                raise ValueError(
                    f"Segment.logprobs has {len(self.logprobs)} entries for "
                    f"{len(self.token_ids)} token_ids; they must match one to one"
                )
            if self.step < 0:
                raise ValueError("Segment.step must be >= 0 for assistant segments")


@dataclass
class Trajectory:
    """One multi-turn episode of one task.

    Attributes:
        uid: task/group uid; all G rollouts of one task share it (groups are found by uid, never
            by batch position).
        segments: prompt first, then alternating assistant / observation spans.
        step_rewards: reward per step (len == num_steps): what the environment paid at each step
            with the outcome taken off the last (docs/algorithms.md, Notation), plus SPADER's diversity reward.
        outcome_reward: environment outcome reward of the episode (EM, F1, +1/-1, success...).
        policy_version: version of the weights that generated the assistant tokens; with
            segments of several versions (partial rollouts), the oldest of them (a trajectory's
            lag is the age of its oldest segment).
        truncated: stopped by max_turns or the context budget before a final answer.
        stats: the environment's typed end-of-episode counters (:class:`EpisodeStats`); None only
            for trajectories that no environment produced (synthetic tests); pieces that need a
            stat raise, naming it, instead of assuming a default.
        rollout: what the rollout recorded (turns, decoded assistant texts, errors).
        rewards: named reward components added by algorithms (e.g. {"tool_bonus": 0.3});
            ``total_reward`` sums them with the outcome.
        derived: values algorithms compute from the batch (e.g. SPADER's ``step_advantages``);
            output only, never an input of another stage.
        task: the task dict the episode was sampled for (user reward functions read it).
        traj_id: unique id of this rollout.
        step_prompts: the sample layout (docs/design.md "Sample layouts: full and window").
            None (layout ``"full"``): the episode is one context, ``segments`` in order. A list
            (layout ``"window"``, ``.env_runners(step_context="window")``): the token ids of the
            prompt each step k was sampled from (len == num_steps); ``segments`` still hold the
            episode's prompt, assistant and observation spans in order, so estimators, filters
            and SIL read the episode as in the full layout, and the learner trains one sample
            per step (core/step_samples.py).
    """

    uid: str
    segments: list[Segment]
    outcome_reward: float = 0.0
    step_rewards: list[float] = field(default_factory=list)
    policy_version: int = 0
    truncated: bool = False
    stats: EpisodeStats | None = None
    rollout: RolloutRecord = field(default_factory=RolloutRecord)
    rewards: dict[str, float] = field(default_factory=dict)
    derived: dict[str, Any] = field(default_factory=dict)
    task: dict[str, Any] = field(default_factory=dict)
    traj_id: str = ""
    step_prompts: list[list[int]] | None = None

    def __post_init__(self) -> None:
        if not self.segments or self.segments[0].kind != "prompt":
            raise ValueError("Trajectory.segments must start with a 'prompt' segment")
        if self.step_prompts is not None and len(self.step_prompts) != self.num_steps:
            raise ValueError(f"Trajectory.step_prompts has {len(self.step_prompts)} prompts for "
                             f"{self.num_steps} steps; the window layout needs one per step")

    @property
    def layout(self) -> str:
        """``"window"`` (one sample per step, ``step_prompts`` set) or ``"full"`` (one context)."""
        return "full" if self.step_prompts is None else "window"

    def require_stats(self, who: str) -> EpisodeStats:
        """The episode stats, or an error naming ``who`` needs them (synthetic trajectory)."""
        if self.stats is None:
            raise ValueError(f"{who} needs Trajectory.stats (EpisodeStats from the environment); "
                             f"trajectory {self.traj_id or self.uid!r} has none")
        return self.stats

    # ---- structure -------------------------------------------------------------------------
    @property
    def num_steps(self) -> int:
        """Number of assistant turns (steps)."""
        return sum(1 for s in self.segments if s.kind == "assistant")

    @property
    def segment_versions(self) -> list[int | None]:
        """The ``policy_version`` of each assistant segment, in step order."""
        return [s.policy_version for s in self.segments if s.kind == "assistant"]

    @property
    def prompt_length(self) -> int:
        return len(self.segments[0].token_ids)

    @property
    def length(self) -> int:
        return sum(len(s.token_ids) for s in self.segments)

    @property
    def response_length(self) -> int:
        """Tokens after the prompt (assistant and observation tokens)."""
        return self.length - self.prompt_length

    @property
    def num_generated_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments if s.kind == "assistant")

    @property
    def total_reward(self) -> float:
        """R = outcome_reward + sum of the named reward components + sum of step rewards."""
        return float(self.outcome_reward + sum(self.rewards.values()) + sum(self.step_rewards))

    def assistant_token_ids(self) -> list[list[int]]:
        return [s.token_ids for s in self.segments if s.kind == "assistant"]

    # ---- per-token arrays (aligned with input_ids) ------------------------------------------
    def input_ids(self) -> np.ndarray:
        return np.fromiter((t for s in self.segments for t in s.token_ids), dtype=np.int64)

    def loss_mask(self) -> np.ndarray:
        """1.0 on assistant (policy-generated) tokens, 0.0 on prompt and observation tokens."""
        return np.concatenate(
            [np.full(len(s.token_ids), 1.0 if s.kind == "assistant" else 0.0, np.float32)
             for s in self.segments]
        )

    def behaviour_logprobs(self) -> np.ndarray:
        """Engine log-probs on assistant tokens, 0.0 elsewhere."""
        return np.concatenate(
            [np.asarray(s.logprobs, np.float32) if s.kind == "assistant"
             else np.zeros(len(s.token_ids), np.float32) for s in self.segments]
        )

    def token_steps(self) -> np.ndarray:
        """Step index of each assistant token; -1 on prompt and observation tokens."""
        return np.concatenate(
            [np.full(len(s.token_ids), s.step if s.kind == "assistant" else -1, np.int64)
             for s in self.segments]
        )

    def token_advantages(self, advantage: float | Sequence[float]) -> np.ndarray:
        """Broadcast an advantage onto assistant tokens.

        A scalar A gives A on every assistant token (outcome advantage); a sequence A_k (one per
        step) gives A_k on the tokens of step k (step-wise advantage). Non-assistant tokens get 0.
        """
        steps = self.token_steps()
        if np.ndim(advantage) == 0:
            return np.where(steps >= 0, float(advantage), 0.0).astype(np.float32)
        per_step = np.asarray(advantage, np.float32)
        if per_step.shape[0] < self.num_steps:
            raise ValueError(
                f"advantage has {per_step.shape[0]} steps but the trajectory has {self.num_steps}"
            )
        return broadcast_step_advantages(steps, per_step)

    # ---- serialisation (replay buffer, checkpoints, Ray object store) -----------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "uid": self.uid, "traj_id": self.traj_id, "outcome_reward": self.outcome_reward,
            "step_rewards": list(self.step_rewards), "policy_version": self.policy_version,
            "truncated": self.truncated, "rewards": dict(self.rewards), "derived": dict(self.derived),
            "stats": None if self.stats is None else self.stats.to_dict(),
            "rollout": self.rollout.to_dict(), "task": dict(self.task),
            "segments": [
                {"kind": s.kind, "token_ids": list(s.token_ids), "step": s.step,
                 "logprobs": None if s.logprobs is None else list(s.logprobs),
                 **({} if s.policy_version is None else {"policy_version": s.policy_version})}
                for s in self.segments
            ],
            **({} if self.step_prompts is None else {"step_prompts": [list(p) for p in self.step_prompts]}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trajectory":
        segs = [Segment(**s) for s in d["segments"]]
        rest = {k: v for k, v in d.items() if k not in ("segments", "stats", "rollout", "step_prompts")}
        stats = None if d.get("stats") is None else EpisodeStats.from_dict(d["stats"])
        prompts = d.get("step_prompts")  # absent in the full layout and in older checkpoints
        return cls(segments=segs, stats=stats, rollout=RolloutRecord.from_dict(d.get("rollout") or {}),
                   step_prompts=None if prompts is None else [list(p) for p in prompts], **rest)


@dataclass
class TokenBatch:
    """Right-padded tensors of a list of trajectories, aligned token by token.

    Shapes are [B, T]. ``loss_mask`` is 0 on padding; ``attention_mask`` is 1 on real tokens.
    ``advantages`` is 0 wherever ``loss_mask`` is 0.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    token_steps: torch.Tensor

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device | str) -> "TokenBatch":
        return TokenBatch(**{k: v.to(device) for k, v in self.__dict__.items()})

    def select(self, rows: Sequence[int] | slice) -> "TokenBatch":
        return TokenBatch(**{k: v[rows] for k, v in self.__dict__.items()})

    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum().item())


def collate_trajectories(
    trajectories: Sequence[Trajectory],
    advantages: Sequence[np.ndarray] | None = None,
    pad_token_id: int = 0,
    loss_masks: Sequence[np.ndarray] | None = None,
    old_logprobs: Sequence[np.ndarray] | None = None,
) -> TokenBatch:
    """Right-pad trajectories into a :class:`TokenBatch`.

    ``advantages``: one per-token array per trajectory (see ``Trajectory.token_advantages``);
    zeros when None. ``loss_masks`` overrides each trajectory's own mask (filters zero a mask
    without removing the trajectory). ``old_logprobs`` overrides the behaviour log-probs (e.g.
    trainer-recomputed ones). Every array must have the trajectory's length.
    """
    if len(trajectories) == 0:
        raise ValueError("collate_trajectories: trajectories is empty")
    n = len(trajectories)
    for name, arrs in (("advantages", advantages), ("loss_masks", loss_masks),
                       ("old_logprobs", old_logprobs)):
        if arrs is not None and len(arrs) != n:
            raise ValueError(f"collate_trajectories: {name} has {len(arrs)} entries for {n} trajectories")
    lengths = [t.length for t in trajectories]
    T = max(lengths)
    ids = torch.full((n, T), pad_token_id, dtype=torch.long)
    att = torch.zeros((n, T), dtype=torch.long)
    mask = torch.zeros((n, T), dtype=torch.float32)
    logp = torch.zeros((n, T), dtype=torch.float32)
    adv = torch.zeros((n, T), dtype=torch.float32)
    steps = torch.full((n, T), -1, dtype=torch.long)
    for i, (traj, L) in enumerate(zip(trajectories, lengths)):
        m = traj.loss_mask() if loss_masks is None else np.asarray(loss_masks[i], np.float32)
        lp = traj.behaviour_logprobs() if old_logprobs is None else np.asarray(old_logprobs[i], np.float32)
        a = np.zeros(L, np.float32) if advantages is None else np.asarray(advantages[i], np.float32)
        for name, arr in (("loss_masks", m), ("old_logprobs", lp), ("advantages", a)):
            if arr.shape != (L,):
                raise ValueError(
                    f"collate_trajectories: {name}[{i}] has shape {arr.shape}, expected ({L},)"
                )
        ids[i, :L] = torch.from_numpy(traj.input_ids())
        att[i, :L] = 1
        mask[i, :L] = torch.from_numpy(m)
        logp[i, :L] = torch.from_numpy(lp) * mask[i, :L]
        adv[i, :L] = torch.from_numpy(a) * mask[i, :L]
        steps[i, :L] = torch.from_numpy(traj.token_steps())
    return TokenBatch(ids, att, mask, logp, adv, steps)
