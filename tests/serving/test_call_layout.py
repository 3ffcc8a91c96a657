"""The two layouts of an episode's captured calls (core/call_layout.py): one context when the calls
chain token for token, one sample per call otherwise, and how the learner and GiGPO read each."""
from __future__ import annotations

import numpy as np
import pytest

from rllib_spear.core.call_layout import CapturedCall, call_segments, calls_chain
from rllib_spear.core.step_samples import step_samples
from rllib_spear.core.trajectory import Trajectory
from rllib_spear.recipe.estimators import gigpo_anchors


def _call(prompt, completion, version=None):
    return CapturedCall(tuple(prompt), tuple(completion), tuple(-0.5 for _ in completion), version)


def test_chained_calls_are_one_context_with_observations_between():
    c0 = _call([1, 2, 3], [10, 11, 99])
    c1 = _call([1, 2, 3, 10, 11, 99, 5, 6], [12, 99], version=3)
    c2 = _call([1, 2, 3, 10, 11, 99, 5, 6, 12, 99, 7], [13, 99])
    assert calls_chain([c0, c1, c2])
    segments, prompts = call_segments([c0, c1, c2], [0])
    assert prompts is None
    assert [(s.kind, s.token_ids) for s in segments] == [
        ("prompt", [1, 2, 3]), ("assistant", [10, 11, 99]), ("observation", [5, 6]), ("assistant", [12, 99]),
        ("observation", [7]), ("assistant", [13, 99])]
    t = Trajectory("u", segments)
    # the last call's prompt + completion is the whole context: what the learner trains on
    assert list(t.input_ids()) == [*c2.prompt_ids, *c2.completion_ids]
    assert t.loss_mask().sum() == 7 and [s.policy_version for s in segments if s.kind == "assistant"] == [None, 3, None]
    # GiGPO's anchor of step k >= 1: the observation before it
    assert gigpo_anchors(t, 3) == [(1, 2, 3), (5, 6), (7,)]


def test_calls_that_do_not_chain_are_one_sample_each():
    c0 = _call([1, 2, 3], [10, 99])
    c1 = _call([1, 2, 4, 8], [11, 99])  # the program rewrote its history
    assert not calls_chain([c0, c1])
    segments, prompts = call_segments([c0, c1], [0])
    assert prompts == [[1, 2, 3], [1, 2, 4, 8]]
    t = Trajectory("u", segments, step_prompts=prompts)
    assert t.layout == "window"
    # the call prompt is GiGPO's anchor of its step
    assert gigpo_anchors(t, 2) == [(1, 2, 3), (1, 2, 4, 8)]
    adv = t.token_advantages([1.0, 2.0])
    samples = step_samples(t, adv, t.loss_mask(), t.behaviour_logprobs())
    assert [list(s.input_ids()) for s, *_ in samples] == [[1, 2, 3, 10, 99], [1, 2, 4, 8, 11, 99]]
    assert [list(a) for _, a, _, _ in samples] == [[0, 0, 0, 1, 1], [0, 0, 0, 0, 2, 2]]
    assert all(s.uid == "u" for s, *_ in samples)


def test_an_episode_without_calls_is_one_prompt_token_without_loss():
    segments, prompts = call_segments([], [7])
    t = Trajectory("u", segments)
    assert prompts is None and t.num_steps == 0 and list(t.input_ids()) == [7] and t.loss_mask().sum() == 0


def test_a_call_needs_one_log_prob_per_token():
    with pytest.raises(ValueError, match="one to one"):
        CapturedCall((1,), (2, 3), (-1.0,))
    with pytest.raises(ValueError, match="at least one token"):
        CapturedCall((1,), (), ())
    assert np.isfinite(_call([1], [2]).logprobs).all()
