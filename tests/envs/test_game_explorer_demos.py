"""The exploring text-game demonstrator (``scripted_demonstrations(game_player="explorer")``): it
acts on what the observations show only, so a policy can imitate it, and it wins most games."""
import re

import pytest

import rllib_spear.envs.text_game as text_game
from rllib_spear.envs import load_tasks, make_env, scripted_demonstrations
from rllib_spear.data.text_game_worlds import GameSpec


def _actions(conv: list[dict]) -> list[str]:
    return [re.search(r"<action>(.*)</action>", m["content"]).group(1) for m in conv if m["role"] == "assistant"]


def _spec(hidden_in: str, closed: set[str]) -> GameSpec:
    """kitchen (start) - hallway - bedroom; goal: put the key in the bed. The kitchen's fridge is
    closed and holds a mug; the key is in the hallway's ``hidden_in``."""
    contents = {"fridge": ["mug"], "counter": [], "shelf": [], "closet": [], "bed": [], "dresser": []}
    contents[hidden_in].append("key")
    return GameSpec(seed=7, rooms=["kitchen", "hallway", "bedroom"],
                    edges={"kitchen": ["hallway"], "hallway": ["kitchen", "bedroom"], "bedroom": ["hallway"]},
                    receptacles={"kitchen": ["fridge", "counter"], "hallway": ["shelf", "closet"],
                                 "bedroom": ["bed", "dresser"]},
                    contents=contents, closed=closed, start="kitchen", goal_obj="key", goal_rec="bed")


@pytest.mark.parametrize("hidden_in, expected", [
    # hand-played: open what is closed here, move to an unvisited room, open what is closed there,
    # take the key once a take action for it shows, carry it to the bed's room (the bedroom)
    ("closet", ["open fridge", "go to hallway", "open closet", "take key from closet", "go to bedroom",
                "put key in bed"]),
    # the same game with the key in plain sight on the hallway's open shelf: taken on arrival
    ("shelf", ["open fridge", "go to hallway", "take key from shelf", "go to bedroom", "put key in bed"]),
])
def test_explorer_plays_what_it_sees(monkeypatch, hidden_in, expected):
    spec = _spec(hidden_in, closed={"fridge", "closet"})
    monkeypatch.setattr(text_game, "generate_game", lambda *a, **k: spec)
    task = {"uid": "g", "seed": 7, "goal": spec.goal_text}
    (conv,) = scripted_demonstrations("text_game", [task], tool_use_rate=1.0, game_player="explorer")
    assert _actions(conv) == expected
    # the thought names the phase in the goal's words; the action copies them
    thoughts = [re.search(r"<think>(.*)</think>", m["content"]).group(1) for m in conv if m["role"] == "assistant"]
    looking = len(expected) - 3
    assert thoughts == ["I look for the key."] * looking + ["The key is here.", "I carry the key to the bed.",
                                                             "I put the key in the bed."]
    # every action was admissible (no "Invalid action" feedback) and the last one won
    assert not any("Invalid action" in m["content"] for m in conv if m["role"] == "user")
    env = make_env("text_game")
    env.reset(task)
    results = [env.step(f"<think>.</think>\n<action>{a}</action>") for a in expected]
    assert results[-1].done and env.episode_stats().success


def test_explorer_wins_most_train_games_in_8_turns_and_replays():
    tasks = load_tasks("text_game")
    demos = scripted_demonstrations("text_game", tasks, tool_use_rate=1.0, seed=0, game_player="explorer",
                                    env_config={"max_turns": 8})
    assert demos == scripted_demonstrations("text_game", tasks, tool_use_rate=1.0, seed=0,
                                            game_player="explorer", env_config={"max_turns": 8})
    env = make_env("text_game", max_turns=8)
    wins = 0
    for task, conv in zip(tasks, demos):
        env.reset(task)
        for a in _actions(conv):
            env.step(f"<think>.</think>\n<action>{a}</action>")
        wins += env.episode_stats().success
        assert env.invalid_actions == 0
    # 210 of the 244 train games (measured when written); the solver's plans win all of them
    assert len(tasks) == 244 and wins == 210


def test_game_player_is_checked():
    tasks = load_tasks("text_game")[:1]
    with pytest.raises(ValueError, match="game_player must be one of"):
        scripted_demonstrations("text_game", tasks, game_player="oracle")
    with pytest.raises(ValueError, match="text_game only"):
        scripted_demonstrations("search_qa", load_tasks("search_qa")[:1], game_player="explorer")


def test_text_game_cold_start_recipe_uses_the_explorer():
    from rllib_spear.coldstart import task_policy_env_config
    from rllib_spear.coldstart.recipes import task_recipe

    recipe = task_recipe("text_game")
    assert recipe["game_player"] == "explorer" and recipe["tool_use_rate"] == 1.0
    assert task_policy_env_config("text_game") == {"max_turns": 8}
