"""What a response filter masks (``filter_scope``): the whole episode, or (``"step"``, the
released agent tree where every step is a sample) only the steps it flags; hand-made records,
the window layout's step samples, SIL's step admission, and the config check."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from rllib_spear.core.episode import EpisodeStats, RolloutRecord
from rllib_spear.core.step_samples import step_samples
from rllib_spear.core.trajectory import Segment, Trajectory
from rllib_spear.recipe.filters import RESPONSE_FILTERS, apply_filters, register_response_filter


def _traj(turns: list[list[int]], *, caps=None, incomplete_steps=None, has_answer=True, texts=None,
          uid="g", step_prompts=None) -> Trajectory:
    """prompt [1, 2] | a_0 | obs [5] | a_1 | ... | a_{K-1}."""
    segs = [Segment("prompt", [1, 2])]
    for k, ids in enumerate(turns):
        segs.append(Segment("assistant", list(ids), [-0.1] * len(ids), step=k))
        if k < len(turns) - 1:
            segs.append(Segment("observation", [5]))
    stats = EpisodeStats(success=False, outcome_reward=0.0, tool_calls=0, queries_per_step=[], format_ok=True,
                         has_answer=has_answer, incomplete_steps=incomplete_steps)
    rollout = RolloutRecord(turns=len(turns), turn_hit_cap=caps if caps is not None else [False] * len(turns),
                            assistant_texts=texts if texts is not None else ["ok"] * len(turns))
    return Trajectory(uid=uid, segments=segs, outcome_reward=0.0, stats=stats, rollout=rollout,
                      step_prompts=step_prompts)


@pytest.fixture
def user_filters():
    """Registers test filters (name -> fn) and removes them after the test."""
    names = []

    def add(name, fn):
        register_response_filter(name, override=True)(fn)
        names.append(name)

    yield add
    for n in names:
        RESPONSE_FILTERS.unregister(n)


def _cfg(filters, scope, **kw):
    return SimpleNamespace(response_filters=tuple(filters), group_filter_keep_fraction=None, filter_scope=scope,
                           overlong_scope="turn", filter_ngram_size=2, filter_ngram_repeats=2, **kw)


THREE_TURNS = [[3, 4], [6, 7, 8], [9]]  # input_ids: 1 2 | 3 4 | 5 | 6 7 8 | 5 | 9


def test_step_scope_masks_only_the_flagged_turn():
    t = _traj(THREE_TURNS, caps=[False, True, False])
    step = apply_filters([t], _cfg(["overlong"], "step"))
    np.testing.assert_array_equal(step.masks[0], [0, 0, 1, 1, 0, 0, 0, 0, 0, 1])
    assert step.filtered == [True] and step.masked_steps == [[1]] and step.masked_whole == [False]
    assert step.fractions["overlong"] == 1.0
    episode = apply_filters([t], _cfg(["overlong"], "episode"))  # the default: the whole episode
    assert not episode.masks[0].any() and episode.masked_steps == [[]] and episode.masked_whole == [True]


def test_incomplete_per_step_from_the_environment_else_the_episode():
    flagged = _traj(THREE_TURNS, incomplete_steps=[True, False, False], has_answer=False)
    res = apply_filters([flagged], _cfg(["incomplete"], "step"))
    np.testing.assert_array_equal(res.masks[0], [0, 0, 0, 0, 0, 1, 1, 1, 0, 1])
    silent = _traj(THREE_TURNS, has_answer=False)  # reports no incomplete_steps: the episode
    assert not apply_filters([silent], _cfg(["incomplete"], "step")).masks[0].any()


def test_repetition_and_unreadable_text_are_judged_per_turn():
    """[3, 4] in two turns repeats the 2-gram (3, 4) across the episode, never within a turn."""
    t = _traj([[3, 4], [3, 4]], texts=["fine", "bad \ufffd"])
    assert apply_filters([t], _cfg(["repetitive"], "episode")).filtered == [True]
    assert apply_filters([t], _cfg(["repetitive"], "step")).filtered == [False]
    res = apply_filters([t], _cfg(["unreadable"], "step"))
    assert res.masked_steps == [[1]]
    np.testing.assert_array_equal(res.masks[0], [0, 0, 1, 1, 0, 0, 0])


def test_an_episode_flag_still_masks_the_episode_and_flags_combine(user_filters):
    user_filters("first_turn_flag", lambda traj, cfg: [True] + [False] * (traj.num_steps - 1))
    user_filters("episode_flag", lambda traj, cfg: traj.uid == "whole")
    a = _traj(THREE_TURNS, caps=[False, False, True], uid="part")
    b = _traj(THREE_TURNS, uid="whole")
    res = apply_filters([a, b], _cfg(["overlong", "first_turn_flag", "episode_flag"], "step"))
    assert res.masked_steps == [[0, 2], []] and res.masked_whole == [False, True]
    np.testing.assert_array_equal(res.masks[0], [0, 0, 0, 0, 0, 1, 1, 1, 0, 0])
    assert not res.masks[1].any()
    assert res.fractions == {"overlong": 0.5, "first_turn_flag": 1.0, "episode_flag": 0.5, "any": 1.0}


def test_records_that_list_fewer_turns_leave_the_rest_unflagged():
    """A rollout record of before turn_hit_cap existed, or stats whose last turn the
    environment never stepped: the turns they do not list are not flagged, nothing raises."""
    t = _traj(THREE_TURNS, caps=[True], incomplete_steps=[False, True], has_answer=False, texts=["\ufffd"])
    t.rollout.turn_hit_cap = [True]
    res = apply_filters([t], _cfg(["overlong", "incomplete", "unreadable"], "step"))
    assert res.masked_steps == [[0, 1]]
    t.rollout.turn_hit_cap = []
    assert apply_filters([t], _cfg(["overlong"], "step")).filtered == [False]


def test_a_per_step_answer_of_the_wrong_length_is_refused(user_filters):
    user_filters("two_flags", lambda traj, cfg: [False, True])
    with pytest.raises(ValueError, match="'two_flags' returned 2 per-step flags for a trajectory of 3 steps"):
        apply_filters([_traj(THREE_TURNS)], _cfg(["two_flags"], "step"))


def test_window_layout_masks_the_flagged_step_sample_only():
    prompts = [[1, 2], [1, 2, 3, 4, 5], [1, 2, 6, 7, 8, 5]]
    t = _traj(THREE_TURNS, caps=[False, True, False], step_prompts=prompts)
    res = apply_filters([t], _cfg(["overlong"], "step"))
    samples = step_samples(t, np.ones(t.length, np.float32), res.masks[0])
    assert [float(mask.sum()) for _, _, mask, _ in samples] == [2.0, 0.0, 1.0]


def test_step_admission_leaves_the_masked_steps_out():
    from rllib_spear.recipe.self_imitation import _admit_steps

    t = _traj(THREE_TURNS)
    copies, values = _admit_steps([t, t], [np.array([0.5, 0.9, -0.1]), np.array([0.5, 0.9, -0.1])], [[1], []])
    assert copies[0].derived["sil_steps"] == [0] and values[0] == 0.5
    assert copies[1].derived["sil_steps"] == [0, 1] and values[1] == 0.9


def test_filter_scope_is_validated():
    from rllib_spear import DrBoTConfig

    cfg = DrBoTConfig().rl_module(model_config={"model_path": "embedded"})
    assert cfg.filter_scope == "episode"
    cfg.training(filter_scope="step").validate()
    with pytest.raises(ValueError, match="filter_scope"):
        DrBoTConfig().rl_module(model_config={"model_path": "embedded"}).training(filter_scope="turn").validate()
