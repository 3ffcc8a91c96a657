"""Per-step environment rewards reach the trajectory (docs/algorithms.md, Notation: R_i is the
outcome plus the step rewards): ``step_rewards[k]`` is what the environment paid at step k with
the outcome taken off the last step, so ``total_reward`` is the sum of what it paid."""
from __future__ import annotations

from typing import Mapping, Sequence

import pytest
from transformers import AutoTokenizer

from rllib_spear.data.text_game_worlds import generate_game
from rllib_spear.env_runners.engines.base import GenerationEngine, GenerationOutput, SamplingConfig
from rllib_spear.env_runners.rollout import MultiTurnRollout, RolloutConfig, step_rewards_from_env
from rllib_spear.envs import load_tasks, make_env
from rllib_spear.envs.text_game import solve_game
from rllib_spear.models.factory import tiny_model_path


class ScriptedTextEngine(GenerationEngine):
    """Call k answers every prompt with ``replies[k]`` (then the end-of-turn token)."""

    def __init__(self, tok, replies: list[str]):
        self.tok, self.replies, self.calls = tok, replies, 0

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                 max_new_tokens: Sequence[int] | None = None) -> list[GenerationOutput]:
        text = self.replies[min(self.calls, len(self.replies) - 1)]
        self.calls += 1
        ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
        return [GenerationOutput(list(ids), [-0.1] * len(ids), "stop") for _ in prompts]

    def update_weights(self, state_dict: Mapping, version: int) -> None:
        pass


class RecordingEnv:
    """Wraps an env and records every reward its ``step`` paid."""

    def __init__(self, env):
        self.env, self.paid = env, []

    def reset(self, task):
        self.paid = []
        return self.env.reset(task)

    def step(self, text):
        res = self.env.step(text)
        self.paid.append(float(res.reward))
        return res

    def episode_stats(self):
        return self.env.episode_stats()

    def __getattr__(self, name):
        return getattr(self.env, name)


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(tiny_model_path())


def _run(tok, env_factory, replies, task, *, max_turns=12):
    rollout = MultiTurnRollout(ScriptedTextEngine(tok, replies), tok, env_factory, SamplingConfig(max_new_tokens=64),
                               RolloutConfig(max_turns=max_turns, max_model_len=8192, max_response_tokens=6000,
                                             max_observation_tokens=1024))
    return rollout.run([task], 1)[0][0]


def test_step_rewards_from_env_by_hand():
    assert step_rewards_from_env([-0.1, -0.1, 10.0], 3, 10.0) == pytest.approx([-0.1, -0.1, 0.0])
    assert step_rewards_from_env([0.0, 0.7], 2, 0.7) == [0.0, 0.0]  # outcome-only env: no step rewards
    assert step_rewards_from_env([-0.1], 3, 0.0) == pytest.approx([-0.1, 0.0, 0.0])  # steps that raised pay 0
    assert step_rewards_from_env([], 0, 0.0) == []


def test_text_game_invalid_action_penalty_reaches_the_return(tok):
    # the probe: 4 invalid actions, the env paid [-0.1] * 4; the trajectory had total 0.0
    task = load_tasks("text_game")[0]
    traj = _run(tok, lambda: make_env("text_game", max_turns=4), ["<think>hm</think><action>fly away</action>"], task,
                max_turns=4)
    assert traj.num_steps == 4 and traj.outcome_reward == 0.0
    assert traj.step_rewards == pytest.approx([-0.1] * 4)
    assert traj.total_reward == pytest.approx(-0.4)


def test_text_game_win_after_invalid_actions(tok):
    task = load_tasks("text_game")[0]
    plan = solve_game(generate_game(task["seed"], task["n_rooms"], task["n_objects"]))
    replies = ["<think>hm</think><action>fly away</action>", "no tags"] + [
        f"<think>go</think><action>{a}</action>" for a in plan]
    traj = _run(tok, lambda: make_env("text_game"), replies, task, max_turns=len(replies))
    assert traj.stats.success and traj.outcome_reward == 10.0
    assert traj.step_rewards == pytest.approx([-0.1, -0.1] + [0.0] * len(plan))
    assert traj.total_reward == pytest.approx(9.8)


@pytest.mark.parametrize("name,replies", [
    ("search_qa", ["<search>capital city</search>", "<answer>Sel</answer>"]),
    ("multi_answer_search", ['<tool_call>["river"]</tool_call>', '<answer>["Sel"]</answer>']),
    ("code_math", ["<answer>\\boxed{3}</answer>"]),
    ("text_game", ["<action>look</action>", "<action>dance</action>", "<action>look</action>"]),
])
def test_every_env_return_is_what_it_paid(tok, name, replies):
    """The contract, per builtin env: R = sum of the env's step rewards, the outcome is the env's
    ``outcome_reward``, and one step reward per turn."""
    envs = []

    def factory():
        envs.append(RecordingEnv(make_env(name)))
        return envs[-1]

    task = load_tasks(name)[0]
    traj = _run(tok, factory, replies, task, max_turns=len(replies))
    paid = envs[0].paid
    assert len(traj.step_rewards) == traj.num_steps == len(paid)
    assert traj.outcome_reward == traj.stats.outcome_reward
    assert traj.total_reward == pytest.approx(sum(paid))


def test_spader_diversity_adds_to_the_env_step_rewards():
    """SPADER's diversity reward is added to the step rewards the environment paid; before, it
    replaced them (an env penalty vanished once the shaper ran)."""
    from rllib_spear.algorithms.spader import SPADERConfig
    from rllib_spear.recipe import REWARD_SHAPERS
    from rllib_spear.testing import _contract_group

    cfg = SPADERConfig()
    plain, penalised = _contract_group(), _contract_group()
    for t in penalised:
        t.step_rewards = [-0.1] * t.num_steps
    REWARD_SHAPERS.get("spader_diversity")(plain, 150, cfg)
    REWARD_SHAPERS.get("spader_diversity")(penalised, 150, cfg)
    for a, b in zip(plain, penalised):
        assert b.step_rewards == pytest.approx([r - 0.1 for r in a.step_rewards])
        assert b.total_reward == pytest.approx(a.total_reward - 0.1 * a.num_steps)
