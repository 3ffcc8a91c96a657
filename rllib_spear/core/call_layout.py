"""The segments of an episode made of captured model calls (docs/design.md "The OpenAI endpoint").

An agent program (envs/agent_program.py) talks to the policy through the runner's OpenAI
endpoint; every call is recorded as a :class:`CapturedCall`: the prompt token ids the engine read,
the completion token ids it sampled, their log-probs and the weights version. The episode becomes
one :class:`~rllib_spear.core.trajectory.Trajectory` in one of the two sample layouts of
docs/design.md "Sample layouts: full and window":

* **full** (the calls chain): every call's prompt starts with the previous call's prompt plus its
  completion, token for token (a chat loop, continued by the endpoint from the sampled ids). The
  episode is one context::

      segments = prompt p_0 | assistant c_0 | observation o_0 | assistant c_1 | ... | assistant c_{K-1}
      o_k      = p_{k+1}[len(p_k) + len(c_k):]     (tool results, user turns, template headers)

* **per call** (the window layout; the calls do not chain: the program rewrote its history,
  summarised it, or ran sub-agents): every call is one learner sample ``p_k | c_k`` sharing the
  task's uid (Agent Lightning's layout), through ``Trajectory.step_prompts`` and
  core/step_samples.py::

      step_prompts = [p_0, p_1, ..., p_{K-1}]
      segments     = prompt p_0 | assistant c_0 | observation p_1 | assistant c_1 | ... | assistant c_{K-1}

  The observation before call k is that call's whole prompt, so GiGPO's anchor of step k is the
  prompt the call acted from (recipe/estimators.gigpo_anchors); the learner trains only
  ``p_k | c_k`` (the observation segments of a window-layout episode are read, never trained).

An episode with no call (the program failed before it called the model) has no step: its one
prompt segment is ``empty_prompt`` (a token the caller chooses), so it keeps its place in its
group with reward 0 and no loss.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .trajectory import Segment

__all__ = ["CapturedCall", "calls_chain", "call_segments"]


@dataclass(frozen=True)
class CapturedCall:
    """One model call of an episode, as the engine saw it.

    ``prompt_ids``: the tokens the engine read; ``completion_ids`` / ``logprobs``: what it sampled
    (end-of-turn or stop tokens included) and the log-prob of each; ``policy_version``: the
    weights version that sampled it (None: not stamped by the engine)."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    policy_version: int | None = None

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.completion_ids):
            raise ValueError(f"CapturedCall: {len(self.logprobs)} log-probs for {len(self.completion_ids)} "
                             "completion tokens; they must match one to one")
        if not self.completion_ids:
            raise ValueError("CapturedCall: a call samples at least one token")


def calls_chain(calls: Sequence[CapturedCall]) -> bool:
    """True when every call's prompt starts with the previous call's prompt + completion."""
    for prev, call in zip(calls, calls[1:]):
        context = prev.prompt_ids + prev.completion_ids
        if call.prompt_ids[:len(context)] != context:
            return False
    return True


def call_segments(calls: Sequence[CapturedCall],
                  empty_prompt: Sequence[int]) -> tuple[list[Segment], list[list[int]] | None]:
    """``(segments, step_prompts)`` of an episode's calls (see the module doc): ``step_prompts``
    None in the full layout (the calls chain), one prompt per call otherwise."""
    if not calls:
        return [Segment("prompt", [int(t) for t in empty_prompt])], None
    segments = [Segment("prompt", list(calls[0].prompt_ids))]
    chained = calls_chain(calls)
    for k, call in enumerate(calls):
        if k > 0:
            prev = calls[k - 1]
            observation = (call.prompt_ids[len(prev.prompt_ids) + len(prev.completion_ids):] if chained
                           else call.prompt_ids)
            if observation:
                segments.append(Segment("observation", list(observation), step=k - 1))
        segments.append(Segment("assistant", list(call.completion_ids), list(call.logprobs), step=k,
                                policy_version=call.policy_version))
    return segments, None if chained else [list(c.prompt_ids) for c in calls]
