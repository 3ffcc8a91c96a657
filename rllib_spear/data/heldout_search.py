"""A held-out search task: a second fictional world, written in other words, as released-format files.

The embedded search task (:mod:`rllib_spear.data.generate`, world seed 1234) is the world every
cold start was trained on. This module builds the task a user would bring instead: a world drawn
under another seed (the same name pools, so the names look alike, but every fact differs), whose
passages and questions use templates the cold starts never saw, saved as a Search-R1 JSONL
dataset (``id, question, golden_answers, data_source``: the ``search_r1`` format of
``rllib_spear/envs/formats.py``) and an ``id, title, text`` corpus parquet. A policy can only
answer it by searching this corpus and reading what it returns.

    from rllib_spear.data.heldout_search import write_heldout_search_task
    paths = write_heldout_search_task("out/heldout", seed=2027)
    cfg.environment("search_qa", dataset=paths["dataset"], env_config={"corpus_path": paths["corpus"]})
"""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

from .generate import REGIONS, World, _uid, build_world, split_of

__all__ = ["HELDOUT_SEED", "heldout_corpus_rows", "heldout_search_rows", "write_heldout_search_task"]

#: The default world seed of the held-out task (the embedded task's is 1234).
HELDOUT_SEED = 2027


def heldout_corpus_rows(w: World) -> list[dict]:
    """``id, title, text`` passages of ``w``: one per person, town, river and region, in templates
    that differ from the embedded corpus's (``generate.corpus_rows``) word for word."""
    rows = []
    for i, p in enumerate(sorted(w.people, key=lambda x: x.name)):
        rows.append({"id": f"hp-{i:03d}", "title": p.name,
                     "text": f"Born in {p.year} at {p.town}, {p.name} worked as a {p.occupation}. "
                             f"A pupil of {p.mentor}, {p.name} is remembered for the {p.invention}."})
    for i, t in enumerate(sorted(w.towns, key=lambda x: x.name)):
        rows.append({"id": f"ht-{i:03d}", "title": t.name,
                     "text": f"Set on the banks of the {t.river} river, {t.name} belongs to the {t.region} "
                             f"region; {t.founder} founded it in {t.founded}."})
    for i, (r, reg) in enumerate(sorted(w.rivers.items())):
        rows.append({"id": f"hr-{i:03d}", "title": f"{r} river", "text": f"Most of the {r} river lies in {reg}."})
    for i, reg in enumerate(REGIONS):
        rows.append({"id": f"hg-{i:03d}", "title": f"{reg} region",
                     "text": f"{w.capitals[reg]} serves as the capital of the {reg} region."})
    return rows


def heldout_search_rows(w: World, seed: int = HELDOUT_SEED) -> list[dict]:
    """Search-R1 rows (``id, question, golden_answers, data_source``, plus ``split``) about ``w``:
    two one-hop questions per person, one per town, and 200 two-hop questions
    (``heldout_1hop`` / ``heldout_2hop``), each worded unlike the embedded task's."""
    rng = random.Random(seed + 1)
    person_q = [
        ("In which town was {p} born?", lambda p: p.town),
        ("In what year was {p} born?", lambda p: str(p.year)),
        ("Which invention is {p} remembered for?", lambda p: p.invention),
        ("Who taught {p}?", lambda p: p.mentor),
        ("What did {p} work as?", lambda p: p.occupation),
    ]
    town_q = [
        ("On the banks of which river is {t} set?", lambda t: t.river),
        ("Who was the founder of {t}?", lambda t: t.founder),
        ("Which region does {t} belong to?", lambda t: t.region),
    ]
    two_hop = [
        ("On the banks of which river is the birthplace of {p} set?", lambda p: w.town_by_name[p.town].river),
        ("What did the teacher of {p} work as?", lambda p: w.by_name[p.mentor].occupation),
        ("In which town was the teacher of {p} born?", lambda p: w.by_name[p.mentor].town),
        ("Who was the founder of the town {p} was born in?", lambda p: w.town_by_name[p.town].founder),
    ]
    rows: list[dict] = []

    def add(question: str, answer: str, source: str) -> None:
        uid = _uid("hsq", question)
        rows.append({"id": uid, "question": question, "golden_answers": [answer], "data_source": source,
                     "split": split_of(uid)})

    for p in w.people:
        for tmpl, f in rng.sample(person_q, 2):
            add(tmpl.format(p=p.name), f(p), "heldout_1hop")
    for t in w.towns:
        tmpl, f = rng.choice(town_q)
        add(tmpl.format(t=t.name), f(t), "heldout_1hop")
    for p in rng.sample(w.people, 200):
        tmpl, f = rng.choice(two_hop)
        add(tmpl.format(p=p.name), f(p), "heldout_2hop")
    unique: dict[str, dict] = {}  # two templates can word two questions alike: keep the first
    for r in rows:
        unique.setdefault(r["id"], r)
    return list(unique.values())


def write_heldout_search_task(out_dir: str | os.PathLike, seed: int = HELDOUT_SEED) -> dict[str, str]:
    """Write ``<out_dir>/{train,test}.jsonl`` (Search-R1 rows) and ``<out_dir>/corpus.parquet`` of
    the held-out world of ``seed`` (``ValueError`` for the embedded world's seed 1234) and return
    ``{"dataset": <out_dir>, "corpus": <corpus.parquet>}``; the same seed writes the same bytes."""
    if int(seed) == 1234:
        raise ValueError("write_heldout_search_task: seed 1234 is the embedded world's; pass another seed")
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    w = build_world(seed)
    corpus = heldout_corpus_rows(w)
    pq.write_table(pa.Table.from_pylist(corpus), out / "corpus.parquet")
    rows = heldout_search_rows(w, seed)
    for split in ("train", "test"):
        with open(out / f"{split}.jsonl", "w") as fh:
            for r in rows:
                if r["split"] == split:
                    fh.write(json.dumps({k: v for k, v in r.items() if k != "split"}) + "\n")
    return {"dataset": str(out), "corpus": str(out / "corpus.parquet")}
