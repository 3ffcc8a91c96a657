"""Dr.BoT's overlong filter per episode or per turn (``overlong_scope``), hand-made records."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from rllib_spear.core.episode import EpisodeStats, RolloutRecord
from rllib_spear.core.trajectory import Segment, Trajectory
from rllib_spear.recipe import RESPONSE_FILTERS
from rllib_spear.recipe.filters import apply_filters


def _traj(uid: str, reached: bool, caps: list[bool], reward: float) -> Trajectory:
    segs = [Segment("prompt", [1, 2])]
    for k, _ in enumerate(caps):
        segs.append(Segment("assistant", [3, 4], [-0.1, -0.2], step=k))
        if k < len(caps) - 1:
            segs.append(Segment("observation", [5]))
    stats = EpisodeStats(success=False, outcome_reward=reward, tool_calls=0, queries_per_step=[],
                         format_ok=True, has_answer=True)
    return Trajectory(uid=uid, segments=segs, outcome_reward=reward, stats=stats,
                      rollout=RolloutRecord(turns=len(caps), reached_max_length=reached, turn_hit_cap=caps))


CASES = [  # (reached_max_length, turn_hit_cap) -> (episode scope, turn scope)
    ((False, [False, False]), (False, False)),
    ((False, [False, True]), (False, True)),   # a middle turn cut at max_new_tokens
    ((True, [False, True]), (True, True)),     # the episode's budget ran out in its last turn
    ((True, []), (True, True)),                # a record of before the flag existed
]


@pytest.mark.parametrize("record,want", CASES)
def test_overlong_by_scope(record, want):
    f = RESPONSE_FILTERS.get("overlong")
    t = _traj("u", *record, reward=0.0)
    got = tuple(f(t, SimpleNamespace(overlong_scope=scope)) for scope in ("episode", "turn"))
    assert got == want


def test_turn_scope_masks_the_whole_episode():
    trajs = [_traj("g", False, [False, True], 1.0), _traj("g", False, [False, False], 0.0)]
    cfg = SimpleNamespace(response_filters=("overlong",), group_filter_keep_fraction=None, overlong_scope="turn")
    res = apply_filters(trajs, cfg)
    assert res.filtered == [True, False] and res.fractions["overlong"] == 0.5
    assert not res.masks[0].any()
    np.testing.assert_array_equal(res.masks[1], [0, 0, 1, 1, 0, 1, 1])
    cfg.overlong_scope = "episode"
    assert apply_filters(trajs, cfg).filtered == [False, False]


def test_scope_is_validated():
    from rllib_spear import DrBoTConfig

    cfg = DrBoTConfig().rl_module(model_config={"model_path": "embedded"})
    assert cfg.overlong_scope == "episode"
    cfg.training(overlong_scope="turn").validate()
    with pytest.raises(ValueError, match="overlong_scope"):
        DrBoTConfig().rl_module(model_config={"model_path": "embedded"}).training(overlong_scope="step").validate()
