"""SPADER's diversity-aware exploration reward (docs/algorithms.md 3.2).

Entities are indices into a task's deduplicated gold list (``answers.dedupe_gold_entities``), so
aliases of one entity count once and |GT| is the number of entities, not of aliases.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from .advantages import group_indices
from .answers import normalize_answer

__all__ = [
    "entities_in_text",
    "DiversityDetails",
    "diversity_step_details",
    "diversity_step_rewards",
]


def entities_in_text(text: str, gold_entities: Sequence[frozenset[str] | Sequence[str] | str]
                     ) -> list[int]:
    """Indices (ascending) of the gold entities found in ``text``.

    Entity e is found iff some alias a of e has ``normalize_answer(a) != ""`` and
    ``normalize_answer(a)`` is a substring of ``normalize_answer(text)`` (plain substring, as
    released ``extract_gt_entities_from_text``). Aliases are re-normalised, so raw alias lists work
    as well as the output of ``dedupe_gold_entities``.
    """
    if not isinstance(text, str):
        raise ValueError(f"entities_in_text: text must be a str, got {type(text).__name__}")
    text_norm = normalize_answer(text)
    if not text_norm:
        return []
    found = []
    for i, ent in enumerate(gold_entities):
        aliases = [ent] if isinstance(ent, str) else list(ent)
        for alias in aliases:
            a = normalize_answer(alias)
            if a and a in text_norm:
                found.append(i)
                break
    return found


@dataclass
class DiversityDetails:
    """Everything :func:`diversity_step_details` computed, per trajectory and step.

    Attributes:
        rewards: r_k(i) (what :func:`diversity_step_rewards` returns).
        new_entities: new_k(i), sorted entity indices first discovered at step k.
        num_new: |new_k(i)|.
        rarity_weighted: ``sum_{e in new_k(i)} (alpha + beta*exp(-lam*(N(e)-1)))`` before the 1/|GT|.
        tool_cost: ``c * Q_k(i) / |GT|`` subtracted at each step (0 when |GT| = 0).
        entity_frequency: per uid, N(e) for every entity some trajectory of the group found.
        num_gold: |GT| of each trajectory.
    """

    rewards: list[list[float]]
    new_entities: list[list[list[int]]]
    num_new: list[list[int]]
    rarity_weighted: list[list[float]]
    tool_cost: list[list[float]]
    entity_frequency: dict[Hashable, dict[int, int]] = field(default_factory=dict)
    num_gold: list[int] = field(default_factory=list)

    def total_new(self) -> list[int]:
        """Distinct gold entities each trajectory found (over all its steps)."""
        return [sum(n) for n in self.num_new]


def _num_gold_per_traj(num_gold: Mapping[Hashable, int] | Sequence[int], uids: list[Hashable],
                       fn: str) -> list[int]:
    if isinstance(num_gold, Mapping):
        missing = [u for u in dict.fromkeys(uids) if u not in num_gold]
        if missing:
            raise ValueError(f"{fn}: num_gold has no entry for uid(s) {missing[:3]!r}")
        out = [num_gold[u] for u in uids]
    else:
        out = list(num_gold)
        if len(out) != len(uids):
            raise ValueError(f"{fn}: num_gold has {len(out)} entries for {len(uids)} trajectories")
        per_uid: dict[Hashable, int] = {}
        for u, g in zip(uids, out):
            if per_uid.setdefault(u, g) != g:
                raise ValueError(
                    f"{fn}: num_gold differs within group {u!r} ({per_uid[u]} vs {g}); "
                    "one task has one gold set"
                )
    for g in out:
        if isinstance(g, bool) or not isinstance(g, numbers.Integral) or g < 0:
            raise ValueError(f"{fn}: num_gold entries must be ints >= 0, got {g!r}")
    return [int(g) for g in out]


def diversity_step_details(
    found_per_step: Sequence[Sequence[Sequence[int]]],
    queries_per_step: Sequence[Sequence[int]],
    uids: Sequence[Hashable],
    num_gold: Mapping[Hashable, int] | Sequence[int],
    *,
    alpha: float = 1.0,
    beta: float = 4.0,
    lam: float = 1.0,
    tool_cost: float = 0.0,
) -> DiversityDetails:
    """Per-step diversity rewards with their ingredients (docs/algorithms.md 3.2).

    Inputs per trajectory i (same order as ``uids``): ``found_per_step[i][k]`` = gold entity
    indices found in the tool response of step k (duplicates ignored); ``queries_per_step[i][k]``
    = Q_k(i), the number of queries issued at step k; ``num_gold`` = |GT| by uid or per trajectory.

        new_k(i) = found_k(i) minus found_0(i) U ... U found_{k-1}(i)
        N(e)     = #{ j with uid(j) = uid(i) : e in U_k found_k(j) }
        r_k(i)   = ( sum_{e in new_k(i)} (alpha + beta * exp(-lam * (N(e) - 1))) - c * Q_k(i) ) / |GT|

    with c = ``tool_cost`` (the scheduled c(t), see ``schedules.spader_tool_cost``). |GT| = 0
    gives all-zero rewards (cost included), as released.
    """
    fn = "diversity_step_rewards"
    uids = list(uids)
    n = len(uids)
    if n == 0:
        raise ValueError(f"{fn}: uids is empty")
    if len(found_per_step) != n:
        raise ValueError(f"{fn}: found_per_step has {len(found_per_step)} entries for {n} uids")
    if len(queries_per_step) != n:
        raise ValueError(f"{fn}: queries_per_step has {len(queries_per_step)} entries for {n} uids")
    for name, v in (("alpha", alpha), ("beta", beta), ("lam", lam), ("tool_cost", tool_cost)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{fn}: {name} must be a finite number, got {v!r}")
    if tool_cost < 0:
        raise ValueError(f"{fn}: tool_cost must be >= 0, got {tool_cost}")
    gold = _num_gold_per_traj(num_gold, uids, fn)

    found_sets: list[list[set[int]]] = []
    for i in range(n):
        steps = found_per_step[i]
        if len(queries_per_step[i]) != len(steps):
            raise ValueError(
                f"{fn}: queries_per_step[{i}] has {len(queries_per_step[i])} steps but "
                f"found_per_step[{i}] has {len(steps)}"
            )
        per_step = []
        for k, ents in enumerate(steps):
            s = set()
            for e in ents:
                if isinstance(e, bool) or not isinstance(e, numbers.Integral) or not 0 <= e < gold[i]:
                    raise ValueError(
                        f"{fn}: found_per_step[{i}][{k}] holds {e!r}, not an entity index in [0, {gold[i]})"
                    )
                s.add(int(e))
            per_step.append(s)
        for k, q in enumerate(queries_per_step[i]):
            if isinstance(q, bool) or not isinstance(q, numbers.Integral) or q < 0:
                raise ValueError(f"{fn}: queries_per_step[{i}][{k}] must be an int >= 0, got {q!r}")
        found_sets.append(per_step)

    # N(e): within-group only, each trajectory counted once per entity.
    freq: dict[Hashable, dict[int, int]] = {}
    for u, idx in group_indices(uids, n, fn).items():
        counts: dict[int, int] = {}
        for i in idx:
            for e in set().union(*found_sets[i]):
                counts[e] = counts.get(e, 0) + 1
        freq[u] = dict(sorted(counts.items()))

    rewards, new_ents, num_new, weighted, costs = [], [], [], [], []
    for i in range(n):
        seen: set[int] = set()
        r_i, new_i, w_i, c_i = [], [], [], []
        for k, found in enumerate(found_sets[i]):
            new = sorted(found - seen)
            seen |= found
            w = sum(alpha + beta * math.exp(-lam * (freq[uids[i]][e] - 1)) for e in new)
            if gold[i] == 0:
                cost_k, r = 0.0, 0.0
            else:
                cost_k = tool_cost * int(queries_per_step[i][k]) / gold[i]
                r = w / gold[i] - cost_k
            new_i.append(new)
            w_i.append(float(w))
            c_i.append(float(cost_k))
            r_i.append(float(r))
        rewards.append(r_i)
        new_ents.append(new_i)
        num_new.append([len(x) for x in new_i])
        weighted.append(w_i)
        costs.append(c_i)
    return DiversityDetails(rewards, new_ents, num_new, weighted, costs, freq, gold)


def diversity_step_rewards(
    found_per_step: Sequence[Sequence[Sequence[int]]],
    queries_per_step: Sequence[Sequence[int]],
    uids: Sequence[Hashable],
    num_gold: Mapping[Hashable, int] | Sequence[int],
    *,
    alpha: float = 1.0,
    beta: float = 4.0,
    lam: float = 1.0,
    tool_cost: float = 0.0,
) -> list[list[float]]:
    """Per trajectory, the list of per-step diversity rewards r_k(i) (docs/algorithms.md 3.2); see
    :func:`diversity_step_details` for the formula and the metrics companion."""
    return diversity_step_details(
        found_per_step, queries_per_step, uids, num_gold,
        alpha=alpha, beta=beta, lam=lam, tool_cost=tool_cost,
    ).rewards
