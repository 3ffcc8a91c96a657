"""Per-step samples of a window-layout episode (docs/design.md "Sample layouts: full and window").

Estimators, filters and SIL work on whole episodes (:class:`~rllib_spear.core.trajectory.Trajectory`)
in both layouts: their per-token arrays (advantages, loss mask, old log-probs) are aligned with
the episode's full ``input_ids`` (``prompt | a_0 | o_0 | a_1 | ... | a_{K-1}``). In the window
layout (``Trajectory.step_prompts`` set) the engine sampled each step k from its own prompt
``p_k`` (the task, the last ``history_steps`` steps, the current observation), so the learner
trains one sample per step. :func:`step_samples` makes them, at the learner-row boundary
(``recipe.batching.build_learner_batches``):

    sample k = Trajectory(segments=[Segment("prompt", p_k), <assistant segment of step k>],
                          uid=episode uid, traj_id=f"{traj_id}:{k}",
                          derived={"episode_id": traj_id, "step": k, ...episode's derived},
                          outcome_reward / stats / task / rewards / rollout: the episode's)
    x_k[t] = 0                            for t <  len(p_k)           (the window prompt)
    x_k[t] = x[start_k + t - len(p_k)]    for t >= len(p_k)           (the step's action)

for each per-token array x (advantages, loss mask, old log-probs), where ``start_k`` is the
position of assistant segment k in the episode's full ``input_ids``. Only step k's response
tokens can carry loss; a filter that masked the episode masks every sample of it, one that
masked step k (``filter_scope="step"``) sample k only. A full-layout trajectory passes through
unchanged (one sample).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .trajectory import Segment, Trajectory

__all__ = ["step_samples", "sample_lengths", "assistant_spans", "StepSample"]

#: (trajectory, advantages, loss mask, old log-probs or None), each array of the trajectory's length
StepSample = tuple[Trajectory, np.ndarray, np.ndarray, "np.ndarray | None"]


def assistant_spans(traj: Trajectory) -> list[tuple[Segment, int]]:
    """(assistant segment, its start in the episode's full input_ids), in step order."""
    out, pos = [], 0
    for seg in traj.segments:
        if seg.kind == "assistant":
            out.append((seg, pos))
        pos += len(seg.token_ids)
    return out


def _check_len(name: str, arr: np.ndarray | None, n: int, traj: Trajectory) -> None:
    if arr is not None and np.shape(arr) != (n,):
        raise ValueError(f"step_samples: {name} has shape {np.shape(arr)}; trajectory "
                         f"{traj.traj_id or traj.uid!r} has {n} tokens (arrays align with its full input_ids)")


def step_samples(traj: Trajectory, advantages: np.ndarray, loss_mask: np.ndarray,
                 old_logp: np.ndarray | None = None) -> list[StepSample]:
    """The learner samples of ``traj`` with their per-token arrays (see the module doc).

    ``advantages``, ``loss_mask`` and ``old_logp`` (optional) are aligned with the episode's full
    ``input_ids``. A full-layout trajectory gives ``[(traj, advantages, loss_mask, old_logp)]``.
    """
    if traj.step_prompts is None:
        return [(traj, advantages, loss_mask, old_logp)]
    n = traj.length
    for name, arr in (("advantages", advantages), ("loss_mask", loss_mask), ("old_logp", old_logp)):
        _check_len(name, arr, n, traj)
    spans = assistant_spans(traj)
    if len(spans) != len(traj.step_prompts):  # Trajectory.__post_init__ checks it; segments may change
        raise ValueError(f"step_samples: trajectory {traj.traj_id or traj.uid!r} has {len(spans)} steps "
                         f"and {len(traj.step_prompts)} step prompts")
    out: list[StepSample] = []
    for k, ((seg, start), prompt) in enumerate(zip(spans, traj.step_prompts)):
        end, pad = start + len(seg.token_ids), np.zeros(len(prompt), np.float32)

        def cut(arr: np.ndarray | None) -> np.ndarray | None:
            if arr is None:
                return None
            return np.concatenate([pad, np.asarray(arr, np.float32)[start:end]])

        sample = Trajectory(
            uid=traj.uid,
            segments=[Segment("prompt", list(prompt)), seg],
            outcome_reward=traj.outcome_reward,
            step_rewards=[traj.step_rewards[k]] if k < len(traj.step_rewards) else [],
            policy_version=seg.policy_version if seg.policy_version is not None else traj.policy_version,
            truncated=traj.truncated, stats=traj.stats, rollout=traj.rollout, rewards=dict(traj.rewards),
            derived={**traj.derived, "episode_id": traj.traj_id, "step": k},
            task=traj.task, traj_id=f"{traj.traj_id}:{k}",
        )
        out.append((sample, cut(advantages), cut(loss_mask), cut(old_logp)))
    return out


def sample_lengths(trajectories: Sequence[Trajectory]) -> list[int]:
    """The token length of every learner sample of ``trajectories`` (one per episode in the full
    layout, one per step in the window layout): what the learner trains on."""
    out: list[int] = []
    for t in trajectories:
        if t.step_prompts is None:
            out.append(t.length)
        else:
            out += [len(p) + len(s.token_ids) for p, (s, _) in zip(t.step_prompts, assistant_spans(t))]
    return out
