"""The per-turn and the per-episode token budgets of the multi-turn rollout, and the per-turn
"hit the cap" flag (``RolloutRecord.turn_hit_cap``) that Dr.BoT's overlong filter reads with
``overlong_scope="turn"`` (docs/recipes.md, "Token budgets").

A scripted engine makes the numbers hand-computable: on each call it wants to write a fixed
number of tokens (the last one the end-of-turn token); it writes them when the cap allows and
finishes with "stop", else it writes exactly the cap and finishes with "length".
"""
from __future__ import annotations

from typing import Mapping, Sequence

import pytest
from transformers import AutoTokenizer

from rllib_spear.env_runners.engines.base import GenerationEngine, GenerationOutput, SamplingConfig
from rllib_spear.env_runners.rollout import MultiTurnRollout, RolloutConfig
from rllib_spear.envs.base import StepResult, ToolEnv
from rllib_spear.models.factory import tiny_model_path


class ScriptedEngine(GenerationEngine):
    """Call k wants ``wants[k]`` tokens (filler ids, then end-of-turn); records every cap it got."""

    def __init__(self, wants: list[int], filler: int, eos: int):
        self.wants, self.filler, self.eos = wants, filler, eos
        self.calls = 0
        self.caps: list[int] = []

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                 max_new_tokens: Sequence[int] | None = None) -> list[GenerationOutput]:
        want = self.wants[self.calls]
        self.calls += 1
        outs = []
        for cap in max_new_tokens or [sampling.max_new_tokens] * len(prompts):
            self.caps.append(int(cap))
            if want <= cap:
                ids = [self.filler] * (want - 1) + [self.eos]
                outs.append(GenerationOutput(ids, [-0.5] * len(ids), "stop"))
            else:
                outs.append(GenerationOutput([self.filler] * cap, [-0.5] * cap, "length"))
        return outs

    def update_weights(self, state_dict: Mapping, version: int) -> None:
        self.version = version


class FixedObsEnv(ToolEnv):
    """A fixed observation after every turn; the episode ends after ``turns`` turns."""

    def __init__(self, turns: int):
        self.turns = turns

    def reset(self, task):
        self.n = 0
        return [{"role": "user", "content": "q"}]

    def step(self, text):
        self.n += 1
        if self.n >= self.turns:
            return StepResult(None, 0.0, True)
        return StepResult("ok", 0.0, False)

    def episode_stats(self):
        return {"tool_calls": self.n - 1, "queries_per_step": [1] * self.n, "success": False,
                "format_ok": True, "has_answer": True, "outcome_reward": 0.0}


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(tiny_model_path())


def _run(tok, wants, *, turns, max_new_tokens, max_response_tokens, max_model_len=4096):
    engine = ScriptedEngine(wants, filler=tok.encode("a", add_special_tokens=False)[0], eos=tok.eos_token_id)
    rollout = MultiTurnRollout(engine, tok, lambda: FixedObsEnv(turns), SamplingConfig(max_new_tokens=max_new_tokens),
                               RolloutConfig(max_turns=turns, max_model_len=max_model_len,
                                             max_response_tokens=max_response_tokens, max_observation_tokens=64))
    traj = rollout.run([{"uid": "t"}], 1)[0][0]
    obs = [len(s.token_ids) for s in traj.segments if s.kind == "observation"]
    return traj, engine.caps, obs


def test_per_turn_cap_is_max_new_tokens_and_flags_the_cut_turn(tok):
    # 3 turns of at most 5 tokens each, a roomy episode budget: turn 2 wants 9 > 5 and is cut at 5
    traj, caps, _ = _run(tok, [3, 9, 2], turns=3, max_new_tokens=5, max_response_tokens=1000)
    assert caps == [5, 5, 5]
    assert [len(t) for t in traj.assistant_token_ids()] == [3, 5, 2]
    assert traj.rollout.turn_hit_cap == [False, True, False]
    assert traj.rollout.reached_max_length is False  # 10 generated + 2 observations << 1000


def test_episode_budget_caps_the_last_turn(tok):
    # Observations have a fixed length n_obs (measured on a first run); a budget of
    # 4 + n_obs + 4 + n_obs + 12 leaves the third turn 12 tokens, fewer than the 20 it wants.
    _, _, obs = _run(tok, [4, 4, 2], turns=3, max_new_tokens=20, max_response_tokens=1000)
    n_obs = obs[0]
    budget = 8 + 2 * n_obs + 12  # the third turn gets 12 tokens
    traj, caps, _ = _run(tok, [4, 4, 20], turns=3, max_new_tokens=20, max_response_tokens=budget)
    assert caps == [20, 20, 12]
    assert traj.rollout.turn_hit_cap == [False, False, True]
    assert traj.rollout.reached_max_length is True  # 4 + 4 + 12 + 2 * n_obs == max_response_tokens
    assert traj.response_length == budget


def test_old_records_without_the_flag_still_load():
    from rllib_spear.core.episode import RolloutRecord

    rec = RolloutRecord.from_dict({"turns": 2, "assistant_texts": ["a", "b"], "reached_max_length": False,
                                   "error": None, "error_stage": None, "env_error": None})
    assert rec.turn_hit_cap == []
    assert RolloutRecord.from_dict(RolloutRecord(turns=1, turn_hit_cap=[True]).to_dict()).turn_hit_cap == [True]
