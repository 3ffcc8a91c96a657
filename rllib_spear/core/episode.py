"""Typed records of one episode: what the environment reports, what the rollout adds, and what
algorithms derive.

Three owners, three records, so that no stage reads another's keys with a permissive default:

- :class:`EpisodeStats`: returned by ``ToolEnv.episode_stats()``. The fields the algorithms need
  (docs/algorithms.md 2.1 tool calls, 3.2 queries and entities, 1.5 answer presence) are typed and
  required; an environment's own counters go to ``extra``. :meth:`EpisodeStats.coerce` validates
  what an environment returns and names the environment and the key when something is wrong.
- :class:`RolloutRecord`: filled by the multi-turn rollout (turns, the decoded assistant texts,
  whether the response budget was hit, errors caught while building a turn).
- ``Trajectory.derived`` (a plain dict): values an algorithm computes from the batch (SPADER's
  per-step advantages and discoveries); never read back as input by another stage.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["EpisodeStats", "RolloutRecord", "EpisodeStatsError"]


class EpisodeStatsError(ValueError):
    """An environment returned episode stats that break the contract of :class:`EpisodeStats`."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) or _is_numpy_int(v)


def _is_numpy_int(v: Any) -> bool:
    return type(v).__module__ == "numpy" and hasattr(v, "dtype") and v.dtype.kind in "iu"


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) or (
        type(v).__module__ == "numpy" and hasattr(v, "dtype") and v.dtype.kind in "iuf")


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool) or (type(v).__module__ == "numpy" and getattr(v, "dtype", None) is not None
                                   and v.dtype.kind == "b")


@dataclass
class EpisodeStats:
    """End-of-episode counters of one environment episode.

    Required (every environment reports them):
        success: the task was solved (EM = 1, all answers found, game won, ...).
        outcome_reward: the environment's outcome reward of the episode.
        tool_calls: number of valid tool calls (SPEAR's tool-call bonus counts these, 2.1).
        queries_per_step: tool queries issued in each step, answer step included (SPADER's tool
            cost, 3.2); ``len`` may be shorter than the number of steps (missing steps = 0).
        format_ok: the episode followed the output format (answer tags, call syntax).
        has_answer: a final answer was given (Dr.BoT's "incomplete" filter, 1.5).

    Optional, typed when present (metrics and SPADER read them):
        em, f1, precision, recall: answer scores in [0, 1].
        found_entities_per_step: per step, indices of the gold entities its observation
            contained (repeats included; SPADER keeps first discoveries, 3.2).
        num_gold_entities: |GT| of the question (SPADER's normaliser, 3.2).
        step_penalties: per step, the part of what that step paid (``StepResult.reward``) that
            is a penalty on its action, as paid (an invalid action of a text game: -0.1; 0
            elsewhere). GiGPO keeps it out of the discounted returns and charges it to its own
            step only, as the released agent tree does (docs/algorithms.md 3.5); ``len`` may be
            shorter than the number of steps (missing steps = 0).
        incomplete_steps: per step, True when that step held no answer / action in the
            environment's format (Dr.BoT's "incomplete" filter per step, 1.5): with
            ``training(filter_scope="step")`` the filter masks those steps only, where
            ``has_answer`` masks the episode.

    ``extra``: anything else the environment wants logged or kept (answer text, exec errors,
    sandbox backend...). Unknown keys given to :meth:`coerce` land here.
    """

    success: bool
    outcome_reward: float
    tool_calls: int
    queries_per_step: list[int]
    format_ok: bool
    has_answer: bool
    em: float | None = None
    f1: float | None = None
    precision: float | None = None
    recall: float | None = None
    found_entities_per_step: list[list[int]] | None = None
    num_gold_entities: int | None = None
    step_penalties: list[float] | None = None
    incomplete_steps: list[bool] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    REQUIRED = ("success", "outcome_reward", "tool_calls", "queries_per_step", "format_ok", "has_answer")
    SCORES = ("em", "f1", "precision", "recall")

    def __post_init__(self) -> None:
        self._check("EpisodeStats")

    # ---- validation ------------------------------------------------------------------------
    def _check(self, source: str) -> None:
        def bad(key: str, want: str) -> EpisodeStatsError:
            return EpisodeStatsError(f"{source}: episode stat {key!r} must be {want}, got {getattr(self, key)!r}")

        for key in ("success", "format_ok", "has_answer"):
            if not _is_bool(getattr(self, key)):
                raise bad(key, "a bool")
            setattr(self, key, bool(getattr(self, key)))
        if not _is_number(self.outcome_reward):
            raise bad("outcome_reward", "a number")
        self.outcome_reward = float(self.outcome_reward)
        if not _is_int(self.tool_calls) or self.tool_calls < 0:
            raise bad("tool_calls", "an integer >= 0")
        self.tool_calls = int(self.tool_calls)
        q = self.queries_per_step
        if not isinstance(q, (list, tuple)) or not all(_is_int(x) and x >= 0 for x in q):
            raise bad("queries_per_step", "a list of integers >= 0 (one per step)")
        self.queries_per_step = [int(x) for x in q]
        for key in self.SCORES:
            v = getattr(self, key)
            if v is not None:
                if not _is_number(v):
                    raise bad(key, "a number or None")
                setattr(self, key, float(v))
        f = self.found_entities_per_step
        if f is not None:
            if not isinstance(f, (list, tuple)) or not all(
                    isinstance(s, (list, tuple, set)) and all(_is_int(e) for e in s) for s in f):
                raise bad("found_entities_per_step", "a list (per step) of lists of gold-entity indices")
            self.found_entities_per_step = [[int(e) for e in s] for s in f]
        if self.num_gold_entities is not None:
            if not _is_int(self.num_gold_entities) or self.num_gold_entities < 0:
                raise bad("num_gold_entities", "an integer >= 0 or None")
            self.num_gold_entities = int(self.num_gold_entities)
        sp = self.step_penalties
        if sp is not None:
            if not isinstance(sp, (list, tuple)) or not all(_is_number(x) and math.isfinite(x) for x in sp):
                raise bad("step_penalties", "a list of finite numbers (one per step)")
            self.step_penalties = [float(x) for x in sp]
        inc = self.incomplete_steps
        if inc is not None:
            if not isinstance(inc, (list, tuple)) or not all(_is_bool(x) for x in inc):
                raise bad("incomplete_steps", "a list of booleans (one per step)")
            self.incomplete_steps = [bool(x) for x in inc]
        if not isinstance(self.extra, dict):
            raise bad("extra", "a dict")

    @classmethod
    def coerce(cls, raw: "EpisodeStats | Mapping[str, Any]", source: str = "environment") -> "EpisodeStats":
        """An :class:`EpisodeStats` from what ``episode_stats()`` returned (the dataclass, or a
        mapping with at least the required keys; other keys go to ``extra``). Raises
        :class:`EpisodeStatsError` naming ``source`` (the environment) and the key."""
        if isinstance(raw, EpisodeStats):
            raw._check(source)
            return raw
        if not isinstance(raw, Mapping):
            raise EpisodeStatsError(f"{source}: episode_stats() must return EpisodeStats or a dict, "
                                    f"got {type(raw).__name__}")
        missing = [k for k in cls.REQUIRED if k not in raw]
        if missing:
            raise EpisodeStatsError(
                f"{source}: episode_stats() lacks the required key(s) {missing}; every environment reports "
                f"{list(cls.REQUIRED)} (see rllib_spear.core.episode.EpisodeStats)")
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in raw.items() if k in names}
        extra = {**dict(raw.get("extra") or {}), **{k: v for k, v in raw.items() if k not in names and k != "extra"}}
        out = cls.__new__(cls)
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            setattr(out, f.name, known.get(f.name, default))
        out.extra = extra
        out._check(source)
        return out

    # ---- access ----------------------------------------------------------------------------
    def score(self, key: str) -> float | None:
        """One of em / f1 / precision / recall, or an ``extra`` number (e.g. ``correct``); None if absent."""
        if key in self.SCORES:
            return getattr(self, key)
        v = self.extra.get(key)
        return float(v) if _is_number(v) or _is_bool(v) else None

    def require(self, key: str, who: str) -> Any:
        """An optional field that ``who`` (an algorithm piece) needs: raises, naming both, when absent."""
        v = getattr(self, key)
        if v is None:
            raise EpisodeStatsError(
                f"{who} needs the episode stat {key!r}, which this environment does not report "
                "(set it in the env's episode_stats(); see rllib_spear.core.episode.EpisodeStats)")
        return v

    def __getitem__(self, key: str) -> Any:
        """Read a reported stat by name (a field or an ``extra`` key); ``KeyError`` when the
        environment did not report it (an optional field left None counts as not reported)."""
        if key != "extra" and key in self.__dataclass_fields__:
            v = getattr(self, key)
            if v is None:
                raise KeyError(key)
            return v
        return self.extra[key]

    def __contains__(self, key: str) -> bool:
        try:
            self[key]
        except KeyError:
            return False
        return True

    def keys(self) -> list[str]:
        """The names of the stats the environment reported (fields not None, then ``extra``)."""
        fields = [f for f in self.__dataclass_fields__ if f != "extra" and getattr(self, f) is not None]
        return fields + [k for k in self.extra if k not in fields]

    def __iter__(self):
        return iter(self.keys())

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "EpisodeStats":
        return cls.coerce(d, "EpisodeStats.from_dict")


@dataclass
class RolloutRecord:
    """What the rollout knows about an episode beyond the environment's stats.

    turns: assistant turns generated; assistant_texts: their decoded texts;
    reached_max_length: the episode's budget (``max_response_tokens``) or the context was hit;
    turn_hit_cap: per assistant turn, whether the engine stopped it at its token cap
    (``finish_reason == "length"``: the per-turn ``max_new_tokens`` or what was left of the
    episode's budget) instead of a stop token; the released per-turn overlong check
    (docs/recipes.md, "Token budgets");
    error / error_stage: an exception caught while building a turn (the episode ended there);
    env_error: an exception raised by ``env.step`` (the turn became an error observation).
    """

    turns: int = 0
    assistant_texts: list[str] = field(default_factory=list)
    reached_max_length: bool = False
    turn_hit_cap: list[bool] = field(default_factory=list)
    error: str | None = None
    error_stage: str | None = None
    env_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RolloutRecord":
        return cls(**d)
