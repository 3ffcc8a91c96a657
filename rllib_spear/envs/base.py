"""The tool-environment interface.

One ``ToolEnv`` instance runs one episode at a time (``reset`` starts a new one); the rollout
worker keeps a pool of instances, so many episodes run concurrently without shared state.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from ..core.episode import EpisodeStats

__all__ = ["StepResult", "ToolEnv", "EpisodeStats"]


@dataclass
class StepResult:
    """What ``ToolEnv.step`` returns.

    ``observation`` is the tool output already wrapped in its tags (e.g.
    ``<information>...</information>``, ``<tool_response>...</tool_response>``), or None when the
    episode is done. The rollout worker puts it into a new user turn of the chat template.
    ``reward`` is what this step pays: a step penalty or bonus, plus the outcome on the step that
    ends the episode. The episode's return is the sum over its steps; ``episode_stats()``'s
    ``outcome_reward`` says which part of it is the outcome, and the rest become the
    trajectory's step rewards (docs/algorithms.md, Notation).
    """

    observation: str | None
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class ToolEnv(ABC):
    """A multi-turn text environment with tools.

    Subclasses keep per-episode state only on ``self`` and expose the counters the algorithms
    need through ``episode_stats()``.
    """

    @abstractmethod
    def reset(self, task: dict[str, Any]) -> list[dict[str, str]]:
        """Start an episode for ``task`` and return the initial chat messages
        (``[{"role": "system", ...}, {"role": "user", ...}]``)."""

    @abstractmethod
    def step(self, assistant_text: str) -> StepResult:
        """Consume one assistant turn (decoded text) and return the observation and reward.
        Never raises on bad model output: malformed calls become error observations."""

    @abstractmethod
    def episode_stats(self) -> EpisodeStats:
        """Counters of the current episode as :class:`~rllib_spear.core.episode.EpisodeStats`
        (or a dict with its keys, validated by the rollout). Required: ``success``,
        ``outcome_reward``, ``tool_calls``, ``queries_per_step`` (one per step, answer step
        included), ``format_ok``, ``has_answer``. Optional typed keys: ``em``, ``f1``,
        ``precision``, ``recall``, ``found_entities_per_step`` (list[list[int]]: indices into the
        deduplicated gold entity list of every gold entity found in each step's observation,
        repeats included; SPADER's reward keeps only first discoveries), ``num_gold_entities``.
        Anything else goes to ``extra``. A missing or mistyped required key stops the run with
        an error naming the environment and the key."""
