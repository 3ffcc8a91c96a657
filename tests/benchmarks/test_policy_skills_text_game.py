"""`benchmarks/policy_skills.py --task text_game`'s imitation measure: the next action after the
exploring demonstration's history, by phase, on engines whose answers are known."""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import policy_skills  # noqa: E402

from rllib_spear.envs import load_tasks, scripted_demonstrations  # noqa: E402

ENV_CONFIG = {"max_turns": 8}


@dataclass
class _Out:
    token_ids: list[int]


class _ScriptedEngine:
    """Answers each prompt with ``answer(history)`` (the conversation the prompt renders)."""

    def __init__(self, tokenizer, demos, answer):
        self.tokenizer = tokenizer
        self._by_prompt = {}
        for conv in demos:
            for k, m in enumerate(conv):
                if m["role"] == "assistant":
                    text = tokenizer.apply_chat_template(conv[:k], add_generation_prompt=True, tokenize=False)
                    self._by_prompt[tuple(tokenizer(text, add_special_tokens=False)["input_ids"])] = answer(m)

    def generate(self, prompts, sampling):
        return [_Out(self.tokenizer(self._by_prompt[tuple(p)], add_special_tokens=False)["input_ids"])
                for p in prompts]


@pytest.fixture(scope="module")
def games_and_tokenizer():
    from transformers import AutoTokenizer

    from rllib_spear.coldstart import default_policy_path

    tasks = load_tasks("text_game", split="test")[:6]
    demos = scripted_demonstrations("text_game", tasks, tool_use_rate=1.0, env_config=ENV_CONFIG,
                                    game_player="explorer")
    return tasks, demos, AutoTokenizer.from_pretrained(default_policy_path())


def test_a_policy_that_plays_the_demonstration_scores_one(games_and_tokenizer):
    tasks, demos, tok = games_and_tokenizer
    engine = _ScriptedEngine(tok, demos, lambda m: m["content"])
    got = policy_skills.next_action_after_demonstration(engine, tasks, ENV_CONFIG)
    turns = sum(m["role"] == "assistant" for c in demos for m in c)
    assert got["all"] == (1.0, turns) and got["admissible"] == (1.0, turns)
    assert sum(n for p, (_, n) in got.items() if p in ("look", "take", "carry", "put")) == turns
    assert sum(n for p, (_, n) in got.items() if p.startswith("turn ")) == turns
    assert got["turn 1"] == (1.0, len(tasks))
    # every won game takes and puts once
    assert got["take"][1] >= got["put"][1] >= 1


def test_a_policy_that_always_looks_scores_zero_yet_stays_admissible(games_and_tokenizer):
    tasks, demos, tok = games_and_tokenizer
    engine = _ScriptedEngine(tok, demos, lambda m: "<think>.</think>\n<action>look</action>")
    got = policy_skills.next_action_after_demonstration(engine, tasks, ENV_CONFIG)
    assert all(v == 0.0 for p, (v, _) in got.items() if p != "admissible")
    assert got["admissible"][0] == 1.0  # "look" is always admissible


def test_a_distractor_take_is_wrong_but_admissible(games_and_tokenizer):
    """At the demonstration's take turn, taking another object shown there counts as wrong."""
    tasks, demos, tok = games_and_tokenizer

    def other_take(m):
        action = re.search(r"<action>(.*)</action>", m["content"]).group(1)
        return f"<think>.</think>\n<action>{action.replace('take ', 'take x', 1)}</action>"

    got = policy_skills.next_action_after_demonstration(_ScriptedEngine(tok, demos, other_take), tasks, ENV_CONFIG)
    assert got["take"][0] == 0.0 and got["look"][0] == 1.0 and got["admissible"][0] < 1.0
