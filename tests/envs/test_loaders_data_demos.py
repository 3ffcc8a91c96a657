import hashlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rllib_spear.core.answers import normalize_answer
from rllib_spear.envs import load_tasks, make_env, scripted_demonstrations


def test_default_datasets_shapes(data_paths):
    sizes = {n: len(load_tasks(n, "train")) + len(load_tasks(n, "test"))
             for n in ("search_qa", "multi_answer_search", "code_math", "text_game")}
    assert all(v >= 150 for v in sizes.values()), sizes
    for n in sizes:
        tr, te = load_tasks(n, "train"), load_tasks(n, "test")
        uids = [t["uid"] for t in tr + te]
        assert len(set(uids)) == len(uids) and te
    for t in load_tasks("multi_answer_search"):
        assert 3 <= len(t["answers"]) <= 8
    for t in load_tasks("search_qa"):
        assert 1 <= len(t["golden_answers"][0].split()) <= 2


def test_generation_is_deterministic(tmp_path, data_paths):
    from rllib_spear.data import generate_all

    a = generate_all(tmp_path / "a")
    b = generate_all(tmp_path / "b")
    for k in a:
        assert pq.read_table(a[k]).equals(pq.read_table(b[k])), k
        assert pq.read_table(a[k]).equals(pq.read_table(data_paths[k])), k


def test_loader_reports_first_bad_row(tmp_path):
    p = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"question": ["a?", "b?", ""], "golden_answers": [["x"], [], ["z"]]}), p)
    with pytest.raises(ValueError, match=r"bad.parquet: row 1, column 'golden_answers'"):
        load_tasks(str(p))
    pq.write_table(pa.table({"question": ["a?"], "answers": [[["A", "B"], ["C"]]], "uid": ["u1"]}), p)
    assert load_tasks(str(p))[0]["answers"] == [["A", "B"], ["C"]]
    pq.write_table(pa.table({"prompt": ["1+1?", "2+2?"], "answer": ["2", None]}), p)
    with pytest.raises(ValueError, match=r"row 1, column 'answer'"):
        load_tasks(str(p))
    pq.write_table(pa.table({"question": ["a", "b"], "golden_answers": [["x"], ["y"]], "uid": ["s", "s"]}), p)
    with pytest.raises(ValueError, match="duplicate uid"):
        load_tasks(str(p))
    pq.write_table(pa.table({"seed": [1, -2]}), p)
    with pytest.raises(ValueError, match=r"row 1, column 'seed'"):
        load_tasks(str(p))
    pq.write_table(pa.table({"foo": [1]}), p)
    with pytest.raises(ValueError, match="cannot tell the task kind"):
        load_tasks(str(p))
    with pytest.raises(ValueError, match="no such file"):
        load_tasks(str(tmp_path / "missing.parquet"))


def test_uids_stable_without_uid_column(tmp_path):
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"question": ["a?", "a?"], "golden_answers": [["x"], ["x"]]}), p)
    u1 = [t["uid"] for t in load_tasks(str(p))]
    u2 = [t["uid"] for t in load_tasks(str(p))]
    assert u1 == u2 and len(set(u1)) == 2


def test_search_r1_reward_model_form(tmp_path):
    p = tmp_path / "r1.parquet"
    pq.write_table(pa.table({"question": ["q?"], "reward_model": [{"ground_truth": {"target": ["A", "B"]}}]}), p)
    assert load_tasks(str(p))[0]["golden_answers"] == ["A", "B"]


@pytest.mark.parametrize("name", ["search_qa", "multi_answer_search", "code_math", "text_game"])
def test_demos_replay_exactly(name):
    tasks = load_tasks(name)[:12]
    demos = scripted_demonstrations(name, tasks, tool_use_rate=0.5, seed=3)
    again = scripted_demonstrations(name, tasks, tool_use_rate=0.5, seed=3)
    assert demos == again and len(demos) == len(tasks)
    env = make_env(name)
    for task, conv in zip(tasks, demos):
        msgs = env.reset(task)
        assert conv[: len(msgs)] == msgs
        rest = conv[len(msgs):]
        assert rest[0]["role"] == "assistant"
        for k, m in enumerate(rest):
            if m["role"] == "assistant":
                r = env.step(m["content"])
                nxt = rest[k + 1] if k + 1 < len(rest) else None
                assert (nxt["content"] if nxt else None) == r.observation or not r.done and nxt is None
            assert len(m["content"]) < 3000


def test_demo_rates_search_qa(sqa_tasks):
    tasks = sqa_tasks[:300]
    tool = scripted_demonstrations("search_qa", tasks, tool_use_rate=1.0)
    direct = scripted_demonstrations("search_qa", tasks, tool_use_rate=0.0)
    env = make_env("search_qa")

    def succ(conv, task):
        env.reset(task)
        for m in conv:
            if m["role"] == "assistant":
                env.step(m["content"])
        return env.episode_stats()["success"]

    tool_rate = sum(succ(c, t) for c, t in zip(tool, tasks)) / len(tasks)
    guess_rate = sum(succ(c, t) for c, t in zip(direct, tasks)) / len(tasks)
    assert tool_rate == 1.0
    assert 0.005 < guess_rate < 0.15
    # grounded: the gold answer is in what the tool returned
    for c, t in zip(tool, tasks):
        obs = " ".join(m["content"] for m in c if m["role"] == "user")
        assert normalize_answer(t["golden_answers"][0]) in normalize_answer(obs)
    mixed = scripted_demonstrations("search_qa", tasks, tool_use_rate=0.2, seed=1)
    frac = sum(any("<search>" in m["content"] for m in c if m["role"] == "assistant") for c in mixed) / len(mixed)
    assert 0.12 < frac < 0.3


def test_evidence_sentence_quotes_the_clause_up_to_the_needle():
    from rllib_spear.envs.demos import evidence_sentence

    obs = ("<information>Doc 1(Title: Mira Gale) Mira Gale was a poet born in Wynby in 1729. Mira Gale invented "
           "the silver bell and studied under Joren Lomax.\nDoc 2(Title: Velby) Velby is a town in the Highcairn "
           "region on the Cellan river. Velby was founded in 1598 by Mira Gale.</information>")
    assert evidence_sentence(obs, "poet") == "Mira Gale was a poet."
    assert evidence_sentence(obs, "1729") == "Mira Gale was a poet born in Wynby in 1729."
    assert evidence_sentence(obs, "Joren Lomax") == "Mira Gale invented the silver bell and studied under Joren Lomax."
    # a needle in several sentences: the one naming the entity wins, else the first in rank order
    assert evidence_sentence(obs, "Mira Gale", "1598") == "Velby was founded in 1598 by Mira Gale."
    assert evidence_sentence(obs, "Mira Gale") == "Mira Gale."
    assert evidence_sentence(obs, "Cellan") == "Velby is a town in the Highcairn region on the Cellan."
    assert evidence_sentence(obs, "nowhere") is None
    assert evidence_sentence("no documents here", "poet") is None


def test_evidence_demos_answer_from_the_quoted_clause():
    tasks = load_tasks("search_qa")[:40]
    demos = scripted_demonstrations("search_qa", tasks, tool_use_rate=1.0, seed=0, think="evidence")
    plain = scripted_demonstrations("search_qa", tasks, tool_use_rate=1.0, seed=0)
    assert [len(d) for d in demos] == [len(p) for p in plain]  # same searches, same observations
    quoted = 0
    for task, conv in zip(tasks, demos):
        final = conv[-1]["content"]
        gold = task["golden_answers"][0]
        assert final.endswith(f"<answer>{gold}</answer>")
        think = final.split("<think>")[1].split("</think>")[0]
        if think != "The results give the answer.":
            assert think.endswith(gold + ".")  # the answer is the last thing quoted
            quoted += 1
    assert quoted >= 36  # the top passages hold the answer for (nearly) every embedded question
    with pytest.raises(ValueError, match="think"):
        scripted_demonstrations("search_qa", tasks[:1], think="cot")


def test_multi_answer_demos_with_search_r1_copy_in_reading_order():
    """search_r1 multi-answer demos search one query per turn and list what they found in the
    order it appears in the results, spelt as there (a copy, not a sort)."""
    import json

    tasks = load_tasks("multi_answer_search")[:40]
    cfg = {"parser": "search_r1", "top_k": 3, "max_turns": 3}
    demos = scripted_demonstrations("multi_answer_search", tasks, tool_use_rate=1.0, env_config=cfg)
    env = make_env("multi_answer_search", **cfg)
    f1 = []
    for task, conv in zip(tasks, demos):
        calls = [m["content"] for m in conv if m["role"] == "assistant"][:-1]
        assert 1 <= len(calls) <= 2 and all(c.count("<search>") == 1 for c in calls)
        assert calls[0].endswith(f"<search>{task['queries'][0]}</search>")
        results = "\n".join(m["content"] for m in conv[2:] if m["role"] == "user").lower()
        names = json.loads(conv[-1]["content"].split("<answer>")[1].split("</answer>")[0])
        spots = [results.find(n.lower()) for n in names]
        assert all(p >= 0 for p in spots) and spots == sorted(spots)
        env.reset(task)
        for m in conv[2:]:
            if m["role"] == "assistant":
                env.step(m["content"])
        s = env.episode_stats()
        assert s["precision"] == 1.0 and s["format_ok"]
        f1.append(s["f1"])
    assert 0.5 < sum(f1) / len(f1) < 0.95  # two searches of 3 passages rarely find every answer
