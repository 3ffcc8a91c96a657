"""Contract tests (one shared suite per plugin kind): every registered environment, parser,
advantage estimator, reward shaper, response filter and policy-loss mode is checked by the same
function of ``rllib_spear.testing``. A new plugin is covered by registering it; the engine
contract runs in tests/engines/test_engine_contract.py (it needs the engine fixtures)."""
from __future__ import annotations

import pytest

from rllib_spear.core.episode import EpisodeStatsError
from rllib_spear.core.losses import POLICY_LOSSES
from rllib_spear.envs import load_tasks, make_env
from rllib_spear.envs.base import StepResult, ToolEnv
from rllib_spear.envs.parsers import get_parser, parser_names
from rllib_spear.recipe import ADVANTAGE_ESTIMATORS, RESPONSE_FILTERS, REWARD_SHAPERS
from rllib_spear.testing import (
    ContractError, check_env_contract, check_estimator_contract, check_loss_mode_contract, check_parser_contract,
    check_response_filter_contract, check_reward_shaper_contract,
)


def _env_names() -> list[str]:
    try:
        from rllib_spear.envs.registry import env_names
    except ImportError:
        from rllib_spear.envs import ENV_NAMES as names
    else:
        names = env_names()
    # multi_answer: an alias of multi_answer_search; agent_program: no text steps, its contract is the
    # agent_program rollout mode's (tests/contracts/test_pipeline_contracts.py, tests/serving/)
    return sorted(n for n in names if n not in ("multi_answer", "agent_program"))


def _recipe_config():
    """A config that holds the knobs of every registered piece (SPADER: the spa estimator set)."""
    from rllib_spear import SPADERConfig

    return SPADERConfig()


@pytest.mark.parametrize("name", _env_names())
def test_env_contract(name):
    if name == "textworld":
        pytest.importorskip("textworld")
    env = make_env(name)
    task = load_tasks(name, "train")[0]
    check_env_contract(env, task, who=name)


@pytest.mark.parametrize("name", parser_names())
def test_parser_contract(name):
    check_parser_contract(get_parser(name), who=f"parser {name!r}")


@pytest.mark.parametrize("name", ADVANTAGE_ESTIMATORS.names())
def test_estimator_contract(name):
    check_estimator_contract(name, _recipe_config())


@pytest.mark.parametrize("name", REWARD_SHAPERS.names())
def test_reward_shaper_contract(name):
    check_reward_shaper_contract(name, _recipe_config())


@pytest.mark.parametrize("name", RESPONSE_FILTERS.names())
def test_response_filter_contract(name):
    check_response_filter_contract(name, _recipe_config())


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_loss_mode_contract(name):
    check_loss_mode_contract(name)


# ---- a user environment that breaks the contract gets a message naming what is wrong
class _BrokenEnv(ToolEnv):
    """Forgets `has_answer` in its stats and raises on a malformed turn."""

    system_prompt = "answer"

    def reset(self, task):
        self.turns = 0
        return [{"role": "system", "content": "s"}, {"role": "user", "content": task["question"]}]

    def step(self, assistant_text):
        self.turns += 1
        if "<answer>" not in assistant_text:
            raise ValueError("no answer tag")
        return StepResult(None, 1.0, True)

    def episode_stats(self):
        return {"success": True, "outcome_reward": 1.0, "tool_calls": 0, "queries_per_step": [0],
                "format_ok": True}


def test_broken_user_env_is_named_with_its_fault():
    with pytest.raises(ContractError, match=r"_BrokenEnv: step\(\) raised ValueError: no answer tag"):
        check_env_contract(_BrokenEnv(), {"question": "q"})

    class NoRaise(_BrokenEnv):
        def step(self, assistant_text):
            self.turns += 1
            return StepResult(None, 0.0, True)

    with pytest.raises(EpisodeStatsError, match=r"NoRaise: episode_stats\(\) lacks the required key\(s\) \['has_answer'\]"):
        check_env_contract(NoRaise(), {"question": "q"})

    class BadType(NoRaise):
        def episode_stats(self):
            return {**super().episode_stats(), "has_answer": True, "tool_calls": "two"}

    with pytest.raises(EpisodeStatsError, match=r"BadType: episode stat 'tool_calls' must be an integer >= 0"):
        check_env_contract(BadType(), {"question": "q"})


def test_new_estimator_is_covered_by_registering_it():
    """The suite checks a newly registered piece too, and catches one that breaks the contract."""
    import numpy as np

    from rllib_spear.recipe import Advantages, register_advantage_estimator

    @register_advantage_estimator("contract_test_leaky")
    def leaky(trajs, cfg):  # puts advantage on observation tokens: a contract violation
        return Advantages([np.ones(t.length, np.float32) for t in trajs], np.zeros(len(trajs)))

    try:
        with pytest.raises(ContractError, match="0 on prompt and observation tokens"):
            check_estimator_contract("contract_test_leaky", _recipe_config())
    finally:
        ADVANTAGE_ESTIMATORS.unregister("contract_test_leaky")
