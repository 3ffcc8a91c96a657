"""The held-out search task (rllib_spear/data/heldout_search.py): released-format files of a second
world whose facts and wording the cold starts never saw, loadable and searchable as a user's task."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from rllib_spear.data import generate
from rllib_spear.data.heldout_search import heldout_corpus_rows, write_heldout_search_task
from rllib_spear.envs import load_tasks
from rllib_spear.envs.retrieval import BM25Retriever
from rllib_spear.envs.search_envs import SearchQAEnv


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> dict:
    return write_heldout_search_task(tmp_path_factory.mktemp("heldout"), seed=2027)


def test_files_load_as_search_r1_and_split(task):
    train = load_tasks(task["dataset"], split="train", env="search_qa")
    test = load_tasks(task["dataset"], split="test", env="search_qa")
    # 240 people x 2 + 50 towns + 200 two-hop = 730 rows, minus questions worded alike
    assert 700 <= len(train) + len(test) <= 730 and len(test) > 100
    assert not {t["uid"] for t in train} & {t["uid"] for t in test}
    assert {t["data_source"] for t in train} == {"heldout_1hop", "heldout_2hop"}
    assert all(isinstance(t["golden_answers"], list) and t["golden_answers"][0] for t in train)


def test_world_and_wording_differ_from_the_embedded_task(task):
    embedded = generate.search_qa_rows(generate.build_world())
    ours = load_tasks(task["dataset"], split="train", env="search_qa")
    assert not {r["question"] for r in embedded} & {t["question"] for t in ours}
    # the embedded templates' fixed words never occur in the held-out passages
    texts = [r["text"] for r in heldout_corpus_rows(generate.build_world(2027))]
    for phrase in (" was a ", "studied under", "is a town in", "flows through", "has its capital"):
        assert not any(phrase in t for t in texts), phrase
    # another seed: the same person is born elsewhere for most names both worlds hold
    a, b = generate.build_world(1234).by_name, generate.build_world(2027).by_name
    shared = sorted(set(a) & set(b))
    assert len(shared) > 20 and sum(a[n].town != b[n].town for n in shared) > 0.8 * len(shared)


def test_answers_are_found_by_searching_the_corpus(task):
    bm25 = BM25Retriever(task["corpus"])
    people = {r["title"]: r["text"] for r in heldout_corpus_rows(generate.build_world(2027))}
    rows = [t for t in load_tasks(task["dataset"], split="test", env="search_qa")
            if t["data_source"] == "heldout_1hop"]
    found = 0
    for t in rows:
        top = bm25.search(t["question"], 3)
        found += any(t["golden_answers"][0] in p.text for p, _ in top)
    # a one-hop question names its entity, whose passage holds the answer
    assert found / len(rows) > 0.9
    assert any(name in people for name in (p.title for p, _ in bm25.search("Zev Harrow", 1)))


def test_the_env_searches_the_heldout_corpus_and_scores_the_answer(task):
    t = next(x for x in load_tasks(task["dataset"], split="test", env="search_qa")
             if x["data_source"] == "heldout_1hop")
    env = SearchQAEnv(corpus_path=task["corpus"], max_turns=3)
    env.reset(t)
    obs = env.step(f"<search>{t['question']}</search>")
    assert not obs.done and t["golden_answers"][0] in obs.observation
    final = env.step(f"<answer>{t['golden_answers'][0]}</answer>")
    assert final.done and final.reward == 1.0 and env.episode_stats().success


def test_same_seed_same_bytes_and_embedded_seed_refused(tmp_path, task):
    again = write_heldout_search_task(tmp_path / "again", seed=2027)
    for name in ("train.jsonl", "test.jsonl"):
        digest = [hashlib.sha256((Path(p) / name).read_bytes()).hexdigest() for p in (task["dataset"], again["dataset"])]
        assert digest[0] == digest[1]
    with pytest.raises(ValueError, match="seed 1234"):
        write_heldout_search_task(tmp_path / "x", seed=1234)
