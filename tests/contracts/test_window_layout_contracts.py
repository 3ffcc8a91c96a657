"""The contract checks run every recipe piece on both sample layouts (docs/design.md "Sample
layouts: full and window"): a piece that reads the layout instead of the episode is caught, and
the window layout's env hook is part of the env contract."""
from __future__ import annotations

import numpy as np
import pytest

from rllib_spear.envs.base import StepResult, ToolEnv
from rllib_spear.recipe import (ADVANTAGE_ESTIMATORS, RESPONSE_FILTERS, Advantages, register_advantage_estimator,
                                register_response_filter)
from rllib_spear.testing import (CONTRACT_LAYOUTS, ContractError, _contract_group, check_env_contract,
                                 check_estimator_contract, check_response_filter_contract)


def _config():
    from rllib_spear import SPADERConfig

    return SPADERConfig()


def test_the_contract_group_comes_in_both_layouts():
    assert CONTRACT_LAYOUTS == ("full", "window")
    full, window = _contract_group("full"), _contract_group("window")
    assert all(t.layout == "full" for t in full) and all(t.layout == "window" for t in window)
    for a, b in zip(full, window):  # the same episodes
        assert a.segments == b.segments and a.uid == b.uid and len(b.step_prompts) == b.num_steps


def test_an_estimator_that_depends_on_the_layout_is_caught():
    @register_advantage_estimator("contract_test_layout")
    def by_layout(trajs, cfg):
        per = np.asarray([t.outcome_reward if t.step_prompts is None else float(len(t.step_prompts[-1]))
                          for t in trajs])
        uids = np.asarray([t.uid for t in trajs])
        ep = per - np.asarray([per[uids == u].mean() for u in uids])  # R_i minus its group mean
        return Advantages([t.token_advantages(e) for t, e in zip(trajs, ep)], ep)

    try:
        with pytest.raises(ContractError, match="differ between the full and the window layout"):
            check_estimator_contract("contract_test_layout", _config())
    finally:
        ADVANTAGE_ESTIMATORS.unregister("contract_test_layout")


def test_a_filter_that_depends_on_the_layout_is_caught():
    @register_response_filter("contract_test_layout_filter")
    def windowed(traj, cfg):
        return traj.step_prompts is not None

    try:
        with pytest.raises(ContractError, match="different episodes in the full and the window layout"):
            check_response_filter_contract("contract_test_layout_filter", _config())
    finally:
        RESPONSE_FILTERS.unregister("contract_test_layout_filter")


class _BadStepPrompt(ToolEnv):
    def reset(self, task):
        self.n = 0
        return [{"role": "user", "content": "go"}]

    def step(self, text):
        self.n += 1
        return StepResult(None if self.n >= 2 else "obs", 0.0, self.n >= 2)

    def episode_stats(self):
        return {"tool_calls": self.n, "queries_per_step": [1] * self.n, "success": False, "format_ok": True,
                "has_answer": True, "outcome_reward": 0.0}

    def step_prompt(self, history_steps):
        return "not messages"


def test_the_env_contract_checks_the_step_prompt_hook():
    with pytest.raises(ContractError, match=r"step_prompt\(0\) must return a non-empty list .* after reset\(\)"):
        check_env_contract(_BadStepPrompt(), {"question": "q"})
