"""Hand-computed checks of rllib_spear.core.schedules (docs/algorithms.md 2.1, 2.3, 3.2, 3.4)."""
import math

import pytest

from rllib_spear.core.schedules import (
    sil_weight,
    spader_tool_cost,
    tool_call_bonus,
    tool_reward_weight,
)

C45 = math.cos(math.pi / 4)  # 0.70711


def test_tool_reward_weight_cosine():
    assert tool_reward_weight(0) == pytest.approx(1.0)
    assert tool_reward_weight(50) == pytest.approx((1 + C45) / 2)  # 0.853553
    assert tool_reward_weight(100) == pytest.approx(0.5)
    assert tool_reward_weight(200) == pytest.approx(0.0, abs=1e-15)
    assert tool_reward_weight(201) == 0.0
    assert tool_reward_weight(10, total_steps=20) == pytest.approx(0.5)


def test_tool_reward_weight_none_constant_and_errors():
    assert tool_reward_weight(5, "none") == 0.0
    assert tool_reward_weight(5000, "constant") == 1.0
    with pytest.raises(ValueError, match="schedule"):
        tool_reward_weight(5, "linear")
    with pytest.raises(ValueError, match="total_steps"):
        tool_reward_weight(5, total_steps=0)
    with pytest.raises(ValueError, match="step"):
        tool_reward_weight(-1)


def test_tool_call_bonus():
    assert tool_call_bonus(0) == 0.0
    assert tool_call_bonus(3) == pytest.approx(0.3)
    assert tool_call_bonus(10) == pytest.approx(1.0)
    assert tool_call_bonus(15) == 1.0  # capped
    assert tool_call_bonus(4, per_call=0.5, cap=1.5) == 1.5
    with pytest.raises(ValueError, match="num_tool_calls"):
        tool_call_bonus(-1)
    with pytest.raises(ValueError, match="cap"):
        tool_call_bonus(1, cap=-1.0)


def test_sil_weight():
    assert sil_weight(0) == 0.0
    assert sil_weight(50) == pytest.approx((1 - C45) / 2)  # 0.146447
    assert sil_weight(100) == pytest.approx(0.5)
    assert sil_weight(200) == pytest.approx(1.0)
    assert sil_weight(300) == 1.0
    assert sil_weight(150, kappa=2.0, total_steps=300) == pytest.approx(1.0)
    assert sil_weight(400, kappa=2.0, total_steps=300) == 2.0
    with pytest.raises(ValueError, match="kappa"):
        sil_weight(1, kappa=-1.0)


def test_spader_tool_cost_ramp():
    assert spader_tool_cost(0) == 0.0
    assert spader_tool_cost(99) == 0.0
    assert spader_tool_cost(100) == 0.0  # ramp starts at 0
    assert spader_tool_cost(150) == pytest.approx(0.005)  # 0.01 * 50/100
    assert spader_tool_cost(199) == pytest.approx(0.0099)
    assert spader_tool_cost(200) == 0.01
    assert spader_tool_cost(10_000) == 0.01
    # Llama script: free 200
    assert spader_tool_cost(250, free_steps=200) == pytest.approx(0.005)


def test_spader_tool_cost_no_ramp():
    assert spader_tool_cost(99, rampup_steps=0) == 0.0
    assert spader_tool_cost(100, rampup_steps=0) == 0.01
    assert spader_tool_cost(5, cost=0.0) == 0.0
    with pytest.raises(ValueError, match="rampup_steps"):
        spader_tool_cost(5, rampup_steps=-1)
    with pytest.raises(ValueError, match="cost"):
        spader_tool_cost(5, cost=-0.01)


