"""The streaming BM25 build (rllib_spear/envs/bm25_index.py) against bm25s's in-memory one, its
on-disk cache and memory-mapped reload (rllib_spear/envs/retrieval.py)."""
import math
import os
import threading

import bm25s
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rllib_spear.envs import bm25_index
from rllib_spear.envs.bm25_index import BM25Index, build_index, tokenize
from rllib_spear.envs.retrieval import BM25Retriever, load_corpus, top_k_indices

QUERIES = ["Velmora river", "who painted the copper kite", "Alder born", "Brin Corla Ossel",
           "river river river", "the of", "zzzz", "Ünïcode naïve café", "1977 born in"]


def write_corpus(path, texts, titles=None, row_group_size=None):
    n = len(texts)
    pq.write_table(pa.table({"id": [f"p{i}" for i in range(n)], "title": titles or [""] * n, "text": texts}),
                   path, row_group_size=row_group_size)


def reference_top_k(corpus_path, query, k, method="lucene"):
    """Today's in-memory build: bm25s over every ``title\\ntext`` at once."""
    ids, titles, texts = load_corpus(corpus_path)
    docs = [f"{t}\n{x}" if t else x for t, x in zip(titles, texts)]
    ref = bm25s.BM25(k1=1.5, b=0.75, method=method)
    ref.index(bm25s.tokenize(docs, stopwords="en", show_progress=False), show_progress=False)
    toks = bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)[0]
    qids = ref.get_tokens_ids(toks)
    if not qids:
        return []
    scores = ref.get_scores_from_ids(qids)
    return [(ids[i], float(scores[i])) for i in top_k_indices(scores, k) if scores[i] > 0]


@pytest.mark.parametrize("method", ["lucene", "robertson", "atire"])
def test_streaming_equals_in_memory_on_the_embedded_corpus(data_paths, tmp_path, method):
    corpus = data_paths["corpus"]
    # 7-row batches: the 308-passage corpus is built across 44 batches
    r = BM25Retriever(corpus, cache_dir=tmp_path, method=method, batch_rows=7)
    assert r.built
    for q in QUERIES:
        got = [(p.id, s) for p, s in r.search(q, 5)]
        want = reference_top_k(corpus, q, 5, method)
        assert [i for i, _ in got] == [i for i, _ in want], q
        assert np.allclose([s for _, s in got], [s for _, s in want], rtol=0, atol=1e-6), q


def test_batch_size_does_not_change_the_index(tmp_path):
    rng = np.random.default_rng(0)
    vocab = [f"w{i}" for i in range(400)] + ["the", "and", "River", "Zürich"]
    texts = [" ".join(rng.choice(vocab, size=rng.integers(1, 40), p=None)) for _ in range(150)]
    texts[3] = "the and of"  # stopwords only: a document of length 0
    a, b = tmp_path / "a", tmp_path / "b"
    build_index(iter([texts]), a)
    build_index((texts[i:i + 4] for i in range(0, len(texts), 4)), b, chunk_docs=5)
    ia, ib = BM25Index(a), BM25Index(b)
    for name in ("indptr", "indices", "data"):
        assert np.array_equal(getattr(ia, name), getattr(ib, name)), name
    assert ia.meta == ib.meta and ia.meta["num_docs"] == 150


def test_hand_computed_scores(tmp_path):
    # N=3, lengths 2, 3, 1 (avgdl 2); "apple" in 2 documents: idf = ln(1 + 1.5/2.5) = ln 1.6
    build_index(iter([["apple banana", "apple apple cherry"], ["banana"]]), tmp_path)
    idx = BM25Index(tmp_path)
    s = idx.scores(idx.query_ids("Apple"))
    # tf / (tf + k1 (1 - b + b |d| / avgdl)), k1 1.5, b 0.75
    want = [math.log(1.6) * 1 / (1 + 1.5 * (0.25 + 0.75 * 2 / 2)),
            math.log(1.6) * 2 / (2 + 1.5 * (0.25 + 0.75 * 3 / 2)), 0.0]
    assert s.dtype == np.float32 and np.allclose(s, want, atol=1e-6)
    assert np.allclose(idx.scores(idx.query_ids("apple apple")), 2 * np.array(want), atol=1e-6)
    assert idx.query_ids("the of unknownword") == []
    assert tokenize("The Velmora-River, 1977 a b") == ["velmora", "river", "1977"]


def test_reload_is_memory_mapped_and_does_not_rebuild(data_paths, tmp_path):
    a = BM25Retriever(data_paths["corpus"], cache_dir=tmp_path)
    files = sorted(a.index_dir.iterdir())
    mtimes = [f.stat().st_mtime_ns for f in files]
    builds = bm25_index.build_count()
    b = BM25Retriever(data_paths["corpus"], cache_dir=tmp_path)
    assert a.built and not b.built and b.index_dir == a.index_dir
    assert bm25_index.build_count() == builds
    assert sorted(b.index_dir.iterdir()) == files and [f.stat().st_mtime_ns for f in files] == mtimes
    for arr in (b._index.data, b._index.indices, b._index.indptr):
        assert isinstance(arr, np.memmap) and arr.mode == "r"
    assert not isinstance(b.texts, list) and len(b.texts) == len(b) == 308
    ids, titles, texts = load_corpus(data_paths["corpus"])
    assert (b.ids[5], b.titles[5], b.texts[-1]) == (ids[5], titles[5], texts[-1])
    assert [p.id for p in a.batch_search(QUERIES, 3)[0]] == [p.id for p in b.batch_search(QUERIES, 3)[0]]
    assert len(list((tmp_path / "sha256").iterdir())) == 1  # the corpus hash is remembered


def test_concurrent_starts_build_once(tmp_path):
    corpus = tmp_path / "c.parquet"
    write_corpus(corpus, [f"passage {i} about river {i % 7}" for i in range(200)], row_group_size=16)
    out = [None, None, None]

    def start(i):
        out[i] = BM25Retriever(corpus, cache_dir=tmp_path / "cache", batch_rows=10)

    ts = [threading.Thread(target=start, args=(i,)) for i in range(3)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert sum(r.built for r in out) == 1
    assert [p.id for p, _ in out[0].search("river 3", 3)] == [p.id for p, _ in out[2].search("river 3", 3)]
    assert [d.name for d in (tmp_path / "cache").iterdir() if d.name.startswith(".") and "tmp" in d.name] == []


def test_hits_read_from_small_row_groups(tmp_path):
    corpus = tmp_path / "c.parquet"
    texts = [f"common filler text number {i}" for i in range(50)]
    texts[37] = "the unique needle passage"
    write_corpus(corpus, texts, titles=[f"T{i}" for i in range(50)], row_group_size=4)
    r = BM25Retriever(corpus, cache_dir=tmp_path, batch_rows=3)
    (p, score), = r.search("needle", 5)
    assert (p.id, p.title, p.text) == ("p37", "T37", "the unique needle passage") and score > 0


def test_bad_method_and_stale_index(tmp_path, data_paths):
    with pytest.raises(ValueError, match="unknown BM25 variant 'bm25x'"):
        BM25Retriever(data_paths["corpus"], cache_dir=tmp_path, method="bm25x")
    r = BM25Retriever(data_paths["corpus"], cache_dir=tmp_path)
    meta = r.index_dir / "meta.json"
    meta.write_text(meta.read_text().replace('"num_docs": 308', '"num_docs": 300'))
    with pytest.raises(ValueError, match="delete that folder"):
        BM25Retriever(data_paths["corpus"], cache_dir=tmp_path)
    os.remove(meta)  # an unfinished entry (no meta.json) is rebuilt
    assert BM25Retriever(data_paths["corpus"], cache_dir=tmp_path).built
