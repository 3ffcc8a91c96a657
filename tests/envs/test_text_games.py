import pytest

from rllib_spear.envs import load_tasks, make_env
from rllib_spear.data.text_game_worlds import generate_game
from rllib_spear.envs.text_game import TextGameGym, solve_game


def test_generated_games_are_solvable_and_deterministic():
    for seed in range(60):
        for n_rooms in (2, 3, 4):
            spec = generate_game(seed, n_rooms, 3)
            assert spec == generate_game(seed, n_rooms, 3)
            g = TextGameGym({"seed": seed, "n_rooms": n_rooms, "n_objects": 3})
            obs, info = g.reset()
            assert spec.goal_text in obs and info["admissible_commands"]
            for a in solve_game(spec):
                assert a in info["admissible_commands"], (seed, a)
                obs, r, term, trunc, info = g.step(a)
            assert term and r == 1.0 and info["won"]


def test_gym_api_invalid_action():
    g = TextGameGym({"seed": 3})
    g.reset()
    obs, r, term, trunc, info = g.step("dance")
    assert obs == "Nothing happens." and not info["valid"] and r == 0 and not term


def test_tool_env_episode_success_and_penalty():
    task = load_tasks("text_game")[0]
    env = make_env("text_game")
    msgs = env.reset(task)
    assert "<action>" in msgs[0]["content"] and "Admissible actions:" in msgs[1]["content"]
    r = env.step("<think>hm</think><action>fly away</action>")
    assert r.observation.startswith("<observation>Invalid action") and r.reward == pytest.approx(-0.1)
    r = env.step("no tags")
    assert "Invalid action" in r.observation
    plan = solve_game(generate_game(task["seed"], task["n_rooms"], task["n_objects"]))
    rewards = []
    for a in plan:
        r = env.step(f"<think>go</think><action>{a.upper()}</action>")  # case-insensitive match
        rewards.append(r.reward)
    assert r.done and r.observation is None and rewards[-1] == 10.0 and sum(rewards[:-1]) == 0
    s = env.episode_stats()
    assert s["success"] and s["tool_calls"] == len(plan) + 2 and s["invalid_actions"] == 2
    assert s["queries_per_step"] == [1] * (len(plan) + 2) and s["outcome_reward"] == 10.0 and not s["format_ok"]
    # "fly away" is well formed (only inadmissible); "no tags" has no action: one unformatted
    # step, so Dr.BoT's incomplete filter masks the episode although it was won
    assert s.extra["unformatted_steps"] == 1 and not s.has_answer
    # per step (filter_scope="step" masks only that step): the second step had no action
    assert s.incomplete_steps == [False, True] + [False] * len(plan)


def test_a_lost_game_in_format_is_complete():
    """Dr.BoT's incomplete filter flags a step out of the action format, never a lost game:
    a policy that cannot win yet still trains on its well-formed episodes."""
    from rllib_spear.recipe.filters import RESPONSE_FILTERS

    env = make_env("text_game", max_turns=2)
    env.reset(load_tasks("text_game")[1])
    env.step("<think>where?</think><action>look</action>")
    env.step("<think>hm</think><action>dance</action>")  # inadmissible, still in format
    s = env.episode_stats()
    assert not s.success and s.has_answer and s.extra["unformatted_steps"] == 0
    env.reset(load_tasks("text_game")[1])
    env.step("<think>where?</think>look")
    assert not env.episode_stats().has_answer

    class _T:  # the filter reads only the stats
        stats = s

        def require_stats(self, who):
            return self.stats

    assert RESPONSE_FILTERS.get("incomplete").fn(_T(), None) is False


def test_max_turns_ends_without_success():
    env = make_env("text_game", max_turns=3)
    env.reset(load_tasks("text_game")[1])
    for k in range(3):
        r = env.step("<action>look</action>")
    assert r.done and not env.episode_stats()["success"] and r.info.get("truncated")


@pytest.fixture(scope="module")
def tw_tasks(tmp_path_factory):
    from rllib_spear.envs.textworld_env import make_textworld_tasks, textworld_available

    if not textworld_available():
        pytest.skip("textworld is not installed (optional: pip install textworld)")
    try:
        return make_textworld_tasks(tmp_path_factory.mktemp("tw"), n=1, seed=7)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"textworld cannot generate a game offline here: {e}")


def test_textworld_adapter_real_game(tw_tasks):
    env = make_env("textworld", max_turns=30)
    msgs = env.reset(tw_tasks[0])
    assert "Admissible actions:" in msgs[1]["content"]
    walkthrough = list(env.last_info["policy_commands"])
    assert walkthrough
    r = env.step("<action>xyzzy frobnicate</action>")
    assert "Invalid action" in r.observation
    for a in walkthrough:
        r = env.step(f"<think>next</think><action>{a}</action>")
        if r.done:
            break
    s = env.episode_stats()
    assert s["success"] and r.reward == 10.0
