"""The tool-environment interface.

One ``ToolEnv`` instance runs one episode at a time (``reset`` starts a new one); the rollout
worker keeps a pool of instances, so many episodes run concurrently without shared state.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from ..core.episode import EpisodeStats

__all__ = ["StepResult", "ToolEnv", "EpisodeStats", "supports_step_prompt"]


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

    def step_prompt(self, history_steps: int) -> list[dict[str, str]]:
        """Optional hook of the window layout (``.env_runners(step_context="window")``,
        docs/design.md "Sample layouts: full and window"): the chat messages of the prompt for
        the step about to be taken: the task, the last ``history_steps`` (observation, action)
        pairs of this episode (fewer when fewer were taken; none at the first step) and the
        current observation, as the released agent harnesses (verl-agent's
        ``build_text_obs``) render each step. The environment records that history itself in
        ``step``. Called after ``reset`` and after every ``step`` that did not end the episode;
        the rollout tokenizes the messages with the chat template (generation prompt added) and
        samples the step from them alone.

        The base implementation raises ``NotImplementedError``: an environment without it runs
        only the full layout (one context per episode), and asking for the window layout with
        it is refused by ``config.validate()`` and by the rollout."""
        raise NotImplementedError(f"{type(self).__name__} has no step_prompt(history_steps): it runs only "
                                  "step_context='full'")


def supports_step_prompt(env_or_cls: Any) -> bool:
    """Whether an environment (instance or class) overrides :meth:`ToolEnv.step_prompt`, i.e. can
    run the window layout."""
    cls = env_or_cls if isinstance(env_or_cls, type) else type(env_or_cls)
    impl = getattr(cls, "step_prompt", None)
    return callable(impl) and impl is not ToolEnv.step_prompt
