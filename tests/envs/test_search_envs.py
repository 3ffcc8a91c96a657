import json
import math

import pytest

from rllib_spear.envs import make_env

BASE_KEYS = {"tool_calls", "queries_per_step", "success", "format_ok", "has_answer", "outcome_reward"}


def _two_hop(tasks):
    return next(t for t in tasks if t["data_source"] == "fictional_2hop")


def test_search_qa_correct_two_hop_episode(sqa_tasks):
    t = _two_hop(sqa_tasks)
    env = make_env("search_qa")
    msgs = env.reset(t)
    assert msgs[0]["role"] == "system" and "<search>" in msgs[0]["content"]
    assert msgs[1] == {"role": "user", "content": f"Question: {t['question']}"}
    r1 = env.step(f"<think>first hop</think>\n<search>{t['queries'][0]}</search>")
    assert r1.observation.startswith("<information>Doc 1(Title: ") and r1.observation.endswith("</information>")
    assert not r1.done and r1.reward == 0
    assert t["queries"][1] in r1.observation  # the bridge entity is in the first hop's results
    r2 = env.step(f"<think>second hop</think>\n<search>{t['queries'][1]}</search>")
    assert t["golden_answers"][0] in r2.observation
    r3 = env.step(f"<think>done</think>\n<answer>{t['golden_answers'][0].upper()}!</answer>")
    assert r3.done and r3.observation is None and r3.reward == 1.0
    s = env.episode_stats()
    assert BASE_KEYS <= set(s)
    assert s["tool_calls"] == 2 and s["queries_per_step"] == [1, 1, 0]
    assert s["success"] and s["em"] == 1.0 and s["f1"] == 1.0 and s["format_ok"] and s["has_answer"]
    assert env.step("<answer>again</answer>").done  # stepping a finished episode does not raise


def test_search_qa_wrong_malformed_and_truncated(sqa_tasks):
    t = sqa_tasks[0]
    env = make_env("search_qa", max_turns=3)
    env.reset(t)
    r = env.step("I will just talk.")
    assert r.observation.startswith("<information>Error: no action") and not r.done
    r = env.step("<search>a</search> <search>b</search>")
    assert "only one <search>" in r.observation
    r = env.step("<search>unclosed")  # third turn = max_turns: ends without running the tool
    assert r.done and r.observation is None and r.reward == 0.0 and r.info.get("truncated")
    s = env.episode_stats()
    assert s["tool_calls"] == 0 and s["queries_per_step"] == [0, 2, 0]
    assert not s["format_ok"] and not s["has_answer"] and not s["success"]
    env.reset(t)
    r = env.step("<think>guess</think><answer>Nobody Atall</answer>")
    assert r.done and r.reward == 0.0 and env.episode_stats()["em"] == 0.0


def test_search_qa_f1_reward_and_parsers(sqa_tasks):
    t = {"uid": "x", "question": "q?", "golden_answers": ["copper kite"]}
    env = make_env("search_qa", reward="f1")
    env.reset(t)
    assert env.step("<answer>the copper lantern</answer>").reward == pytest.approx(0.5)
    env = make_env("search_qa", parser="hermes")
    env.reset(sqa_tasks[1])
    r = env.step('<tool_call>{"name": "search", "arguments": {"query": "%s"}}</tool_call>' % sqa_tasks[1]["queries"][0])
    assert r.observation.startswith("<tool_response>") and sqa_tasks[1]["golden_answers"][0] in r.observation
    env = make_env("search_qa", parser="spader", top_k=2)
    env.reset(sqa_tasks[1])
    r = env.step('<tool_call>["%s", "Velmora"]</tool_call>' % sqa_tasks[1]["queries"][0])
    assert r.observation.count("Query: ") == 2 and env.episode_stats()["queries_per_step"] == [2]


def test_multi_answer_episode_counters(multi_tasks):
    t = next(t for t in multi_tasks if t["question"].startswith("Who was born in"))
    town = t["question"][len("Who was born in "):-1]
    env = make_env("multi_answer_search")
    msgs = env.reset(t)
    assert "<tool_call>" in msgs[0]["content"] and "top-5" in msgs[0]["content"]
    r1 = env.step(f'<think>a</think>\n<tool_call>["born in {town}"]</tool_call>')
    assert r1.observation.startswith("<tool_response>") and not r1.done
    found1 = r1.info["found_entities"]
    assert found1 and all(t["answers"][i][0] in r1.observation for i in found1)
    # several blocks: only the last runs; queries counted over all blocks (non-JSON block = 1)
    r2 = env.step(f'<think>b</think><tool_call>not json</tool_call><tool_call>["born in {town}", "{town}"]</tool_call>')
    assert "only the last <tool_call> block was executed" in r2.observation
    found2 = r2.info["found_entities"]
    names = [t["answers"][i][0] for i in sorted(set(found1) | set(found2))]
    r3 = env.step(f"<think>c</think>\n<answer>{json.dumps(names + ['Wrong Person'])}</answer>")
    assert r3.done and r3.observation is None
    s = env.episode_stats()
    assert BASE_KEYS <= set(s)
    n = len(t["answers"])
    assert s["num_gold_entities"] == n
    assert s["queries_per_step"] == [1, 3, 0]
    assert s["found_entities_per_step"] == [found1, found2, []]
    p, rc = len(names) / (len(names) + 1), len(names) / n
    assert s["precision"] == pytest.approx(p) and s["recall"] == pytest.approx(rc)
    assert r3.reward == pytest.approx(2 * p * rc / (p + rc)) == pytest.approx(s["f1"])
    assert s["tool_calls"] == 2 and s["format_ok"]


def test_multi_answer_with_search_r1_calls(multi_tasks):
    """One <search> query per turn (the call format the embedded default policy knows): the same
    counters, entity discovery and list-answer reward as the JSON-list call formats."""
    t = next(t for t in multi_tasks if t["question"].startswith("Who was born in"))
    town = t["question"][len("Who was born in "):-1]
    env = make_env("multi_answer_search", parser="search_r1", top_k=3)
    msgs = env.reset(t)
    assert "<search>query</search>" in msgs[0]["content"] and "JSON list" in msgs[0]["content"]
    r1 = env.step(f"<think>a</think>\n<search>born in {town}</search>")
    assert r1.observation.startswith("<information>") and r1.observation.count("Doc ") == 3
    found = r1.info["found_entities"]
    assert found and all(t["answers"][i][0] in r1.observation for i in found)
    r2 = env.step(f"<think>b</think>\n<search>{town}</search>")
    found2 = r2.info["found_entities"]
    names = [t["answers"][i][0] for i in sorted(set(found) | set(found2))]
    r3 = env.step(f"<think>c</think>\n<answer>{json.dumps(names)}</answer>")
    s = env.episode_stats()
    assert s["queries_per_step"] == [1, 1, 0] and s["tool_calls"] == 2 and s["format_ok"]
    assert s["found_entities_per_step"] == [found, found2, []]
    assert s["precision"] == 1.0 and s["recall"] == pytest.approx(len(names) / len(t["answers"]))
    assert s["f1"] > 0 and r3.reward == pytest.approx(s["f1"])
    env.reset(t)
    r = env.step("<think>b</think><search>x</search><search>y</search>")  # one query per turn
    assert "only one <search> per turn" in r.observation and r.info["found_entities"] == []
    env.reset(t)
    assert env.step(f"<answer>{names[0]}</answer>").reward == 0.0  # a bare string is not a list


def test_multi_answer_format_errors():
    t = {"uid": "m", "question": "Which?", "answers": [["Alpha One", "A1"], "Beta Two", ["alpha one!", "a1"]]}
    env = make_env("multi_answer_search")
    env.reset(t)
    r = env.step('<think><think>nested</think></think><answer>["Alpha One"]</answer>')
    assert r.done and r.reward == 0.0  # released code: malformed -> 0
    s = env.episode_stats()
    assert not s["format_ok"] and s["num_gold_entities"] == 2 and s["f1"] > 0
    env = make_env("multi_answer_search", format_error_reward=-1.0)
    env.reset(t)
    assert env.step("<think>x</think><answer>Alpha One, Beta Two</answer>").reward == -1.0
    env.reset(t)
    assert env.step("<think>x</think> no answer").reward == -1.0
    env.reset(t)
    r = env.step('<think>x</think><answer>["a1", "beta two"]</answer>')
    assert r.reward == 1.0 and env.episode_stats()["success"]
    env.reset(t)
    assert env.step('<think>x</think><answer>[]</answer>').reward == 0.0 and env.episode_stats()["format_ok"]


def test_entity_match_modes():
    t = {"uid": "e", "question": "?", "answers": [["Ash"], ["Velmora"]]}
    sub = make_env("multi_answer_search")
    word = make_env("multi_answer_search", entity_match="word")
    for env in (sub, word):
        env.reset(t)
    text = "<tool_response>Ashford and Velmora.</tool_response>"
    assert sub._found(text) == [0, 1] and word._found(text) == [1]


def test_multi_answer_truncated_at_max_turns(multi_tasks):
    env = make_env("multi_answer_search", max_turns=2)
    env.reset(multi_tasks[0])
    env.step('<think>a</think><tool_call>["x"]</tool_call>')
    r = env.step('<think>a</think><tool_call>["y", "z"]</tool_call>')
    assert r.done and r.observation is None and r.reward == 0.0
    s = env.episode_stats()
    assert s["queries_per_step"] == [1, 2] and len(s["found_entities_per_step"]) == 2
    assert s["found_entities_per_step"][-1] == [] and not s["has_answer"]


def test_budget_applies_to_a_call(multi_tasks):
    env = make_env("multi_answer_search", max_chars=600, top_k=5)
    env.reset(multi_tasks[0])
    r = env.step('<think>a</think><tool_call>["born", "invented", "river"]</tool_call>')
    inner = r.observation[len("<tool_response>"):-len("</tool_response>")]
    assert inner.endswith("truncated at 600 characters.")
    assert len(inner.rsplit("\n", 1)[0]) <= 600


def test_concurrent_envs_share_retriever_and_keep_state(sqa_tasks):
    from concurrent.futures import ThreadPoolExecutor

    def run(t):
        env = make_env("search_qa")
        env.reset(t)
        for q in t["queries"]:
            env.step(f"<search>{q}</search>")
        env.step(f"<answer>{t['golden_answers'][0]}</answer>")
        return env.episode_stats()["success"], env.retriever

    with ThreadPoolExecutor(8) as ex:
        out = list(ex.map(run, sqa_tasks[:40]))
    assert all(s for s, _ in out)
    assert len({id(r) for _, r in out}) == 1
