"""Checks of the existing rllib_spear.core.trajectory module."""
import numpy as np
import pytest
import torch

from rllib_spear.testing import make_stats
from rllib_spear.core.trajectory import Segment, Trajectory, collate_trajectories


def make_traj(uid="u", **kw):
    # prompt [1, 2] | assistant step 0 [3, 4] | observation [5] | assistant step 1 [6]
    return Trajectory(uid=uid, segments=[
        Segment("prompt", [1, 2]),
        Segment("assistant", [3, 4], [-0.1, -0.2], step=0),
        Segment("observation", [5]),
        Segment("assistant", [6], [-0.3], step=1),
    ], **kw)


def test_structure():
    tr = make_traj(outcome_reward=1.0, step_rewards=[0.1, 0.2], rewards={"tool_bonus": 0.3})
    assert (tr.num_steps, tr.prompt_length, tr.length) == (2, 2, 6)
    assert (tr.response_length, tr.num_generated_tokens) == (4, 3)
    assert tr.total_reward == pytest.approx(1.0 + 0.3 + 0.1 + 0.2)
    assert tr.assistant_token_ids() == [[3, 4], [6]]


def test_per_token_arrays_aligned():
    tr = make_traj()
    np.testing.assert_array_equal(tr.input_ids(), [1, 2, 3, 4, 5, 6])
    np.testing.assert_array_equal(tr.loss_mask(), [0, 0, 1, 1, 0, 1])
    np.testing.assert_allclose(tr.behaviour_logprobs(), [0, 0, -0.1, -0.2, 0, -0.3], rtol=1e-6)
    np.testing.assert_array_equal(tr.token_steps(), [-1, -1, 0, 0, -1, 1])
    assert tr.loss_mask().dtype == np.float32 and tr.token_steps().dtype == np.int64


def test_token_advantages():
    tr = make_traj()
    np.testing.assert_allclose(tr.token_advantages(0.5), [0, 0, 0.5, 0.5, 0, 0.5])
    np.testing.assert_allclose(tr.token_advantages([1.0, -1.0]), [0, 0, 1, 1, 0, -1])
    np.testing.assert_allclose(tr.token_advantages([1.0, -1.0, 9.0]), [0, 0, 1, 1, 0, -1])
    with pytest.raises(ValueError, match="steps"):
        tr.token_advantages([1.0])


def test_prompt_only_zero_length_response():
    tr = Trajectory(uid="p", segments=[Segment("prompt", [1, 2, 3])])
    assert tr.num_steps == 0 and tr.response_length == 0
    np.testing.assert_array_equal(tr.loss_mask(), [0, 0, 0])
    np.testing.assert_array_equal(tr.token_advantages(2.0), [0, 0, 0])


def test_segment_validation():
    with pytest.raises(ValueError, match="kind"):
        Segment("tool", [1])
    with pytest.raises(ValueError, match="logprobs"):
        Segment("assistant", [1], None, step=0)
    with pytest.raises(ValueError, match="logprobs"):
        Segment("assistant", [1, 2], [0.0], step=0)
    with pytest.raises(ValueError, match="step"):
        Segment("assistant", [1], [0.0], step=-1)
    with pytest.raises(ValueError, match="prompt"):
        Trajectory(uid="x", segments=[Segment("assistant", [1], [0.0], step=0)])
    with pytest.raises(ValueError, match="prompt"):
        Trajectory(uid="x", segments=[])


def test_dict_roundtrip():
    tr = make_traj(outcome_reward=0.5, step_rewards=[0.1, 0.0], stats=make_stats(tool_calls=1), traj_id="t1")
    back = Trajectory.from_dict(tr.to_dict())
    assert back == tr


def test_collate_padding_and_masks():
    long, short = make_traj("a"), Trajectory(uid="b", segments=[
        Segment("prompt", [7]), Segment("assistant", [8, 9], [-1.0, -2.0], step=0)])
    adv = [long.token_advantages([1.0, 2.0]), short.token_advantages(3.0)]
    tb = collate_trajectories([long, short], advantages=adv, pad_token_id=-5)
    assert tb.input_ids.shape == (2, 6) and len(tb) == 2
    assert tb.input_ids[1].tolist() == [7, 8, 9, -5, -5, -5]
    assert tb.attention_mask[1].tolist() == [1, 1, 1, 0, 0, 0]
    assert tb.loss_mask.tolist() == [[0, 0, 1, 1, 0, 1], [0, 1, 1, 0, 0, 0]]
    torch.testing.assert_close(tb.old_logprobs[1], torch.tensor([0, -1.0, -2.0, 0, 0, 0]))
    assert tb.advantages.tolist() == [[0, 0, 1, 1, 0, 2], [0, 3, 3, 0, 0, 0]]
    assert tb.token_steps[1].tolist() == [-1, 0, 0, -1, -1, -1]
    assert tb.num_loss_tokens() == 3 + 2
    sub = tb.select([1])
    assert sub.input_ids.shape == (1, 6) and sub.num_loss_tokens() == 2


def test_collate_mask_override_zeroes_advantages_and_logprobs():
    tr = make_traj()
    tb = collate_trajectories([tr], advantages=[tr.token_advantages(1.0)], loss_masks=[np.zeros(6)],
                              old_logprobs=[np.full(6, -0.7)])
    assert tb.num_loss_tokens() == 0
    assert torch.all(tb.advantages == 0) and torch.all(tb.old_logprobs == 0)
    tb2 = collate_trajectories([tr], old_logprobs=[np.full(6, -0.7)])
    torch.testing.assert_close(tb2.old_logprobs[0], torch.tensor([0, 0, -0.7, -0.7, 0, -0.7]))


def test_collate_errors():
    tr = make_traj()
    with pytest.raises(ValueError, match="empty"):
        collate_trajectories([])
    with pytest.raises(ValueError, match="advantages"):
        collate_trajectories([tr], advantages=[np.zeros(5)])
    with pytest.raises(ValueError, match="loss_masks"):
        collate_trajectories([tr], loss_masks=[np.zeros(6), np.zeros(6)])
