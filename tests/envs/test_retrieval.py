import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rllib_spear.core.answers import normalize_answer
from rllib_spear.envs.retrieval import (
    BM25Retriever,
    HTTPRetriever,
    Passage,
    format_search_results,
    get_retriever,
    truncate_round_robin,
)


def P(i, n=10):
    return Passage(str(i), f"T{i}", "x" * n)


def test_round_robin_by_rank_stops_at_first_misfit():
    res = [["a1", "a2", "a3"], ["b1"], ["c1", "c2"]]
    kept, trunc = truncate_round_robin(res, 5, len, overhead=0)
    # order a1 b1 c1 a2 c2 a3; each 2 chars -> a1 b1 (4), c1 would make 6 > 5
    assert kept == [["a1"], ["b1"], []] and trunc
    kept, trunc = truncate_round_robin(res, 100, len)
    assert kept == [list(r) for r in res] and not trunc
    assert truncate_round_robin(res, None, len) == ([list(r) for r in res], False)


def test_format_budget_and_note():
    docs = [[P(i, 300) for i in range(5)] for _ in range(3)]
    out = format_search_results(["q1", "q2", "q3"], docs, max_chars=1000)
    assert out.endswith("System Note: Retrieval results truncated at 1000 characters.")
    body = out.rsplit("\n", 1)[0]
    assert len(body) <= 1000
    assert body.count("Doc 1(") == 3  # rank 1 of every query kept first
    js = format_search_results(["q1", "q2"], docs[:2], max_chars=1200, fmt="json")
    payload = json.loads(js.split("\nSystem Note")[0])
    assert [len(r["documents"]) for r in payload] == [2, 1]
    one = format_search_results(["only"], [[P(1)]], max_chars=None)
    assert one == "Doc 1(Title: T1) xxxxxxxxxx"
    assert format_search_results(["a", "b"], [[], []]).count("No results.") == 2


@pytest.fixture(scope="module")
def bm25(data_paths):
    return get_retriever(data_paths["corpus"])


def test_bm25_finds_answers_for_scripted_queries(bm25, sqa_tasks):
    hits = 0
    for t in sqa_tasks:
        docs = [p for q in t["queries"] for p in bm25.search(q, 3) for p in [p[0]]]
        text = normalize_answer(" ".join(p.title + " " + p.text for p in docs))
        hits += normalize_answer(t["golden_answers"][0]) in text
    assert hits / len(sqa_tasks) > 0.97


def test_bm25_disk_cache_and_process_cache(data_paths, tmp_path):
    a = BM25Retriever(data_paths["corpus"], cache_dir=tmp_path)
    b = BM25Retriever(data_paths["corpus"], cache_dir=tmp_path)
    assert a.built and not b.built
    assert [p.id for p in a.batch_search(["Velmora river"], 5)[0]] == [p.id for p in b.batch_search(["Velmora river"], 5)[0]]
    assert get_retriever(data_paths["corpus"]) is get_retriever(data_paths["corpus"])
    assert a.search("zzzz qqqq", 5) == [] and a.search("", 5) == [] and a.search("the of", 5) == []


def test_bm25_thread_safe(bm25):
    qs = [f"{w} born" for w in ["Alder", "Brin", "Corla", "Velmora", "Ossel", "painter", "copper", "kite"]] * 5
    expect = [[p.id for p in r] for r in bm25.batch_search(qs, 5)]
    got = [None] * len(qs)

    def work(i):
        got[i] = [p.id for p in bm25.search(qs[i], 5) for p in [p[0]]]

    ts = [threading.Thread(target=work, args=(i,)) for i in range(len(qs))]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert got == expect


def test_corpus_validation(tmp_path):
    p = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["1", "2"], "title": ["a", "b"], "text": ["ok", None]}), p)
    with pytest.raises(ValueError, match=r"c.parquet: row 1, column 'text'"):
        BM25Retriever(p, cache_dir=tmp_path)
    pq.write_table(pa.table({"id": ["1"], "text": ["x"]}), p)
    with pytest.raises(ValueError, match="missing column 'title'"):
        BM25Retriever(p, cache_dir=tmp_path)


class _Handler(BaseHTTPRequestHandler):
    fails = 0
    shape = "search_r1"
    seen = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Handler.seen.append(body)
        if _Handler.fails > 0:
            _Handler.fails -= 1
            self.send_response(500)
            self.end_headers()
            return
        if _Handler.shape == "search_r1":
            res = [[{"contents": f'"Title {q}"\ntext about {q}'}] * body["topk"] for q in body["queries"]]
        else:
            res = [{"query": q, "documents": [{"title": f"T {q}", "contents": "c"}]} for q in body["queries"]]
        data = json.dumps({"result": res}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


@pytest.fixture()
def server():
    srv = HTTPServer(("127.0.0.1", 0), _Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/retrieve"
    srv.shutdown()


def test_http_retriever_shapes_and_retries(server):
    _Handler.fails, _Handler.shape = 2, "search_r1"
    r = HTTPRetriever(server, timeout_s=2, retries=2, backoff_s=0.01)
    out = r.batch_search(["a", "b"], 2)
    assert _Handler.seen[-1] == {"queries": ["a", "b"], "topk": 2, "return_scores": False}
    assert out[0][0].title == "Title a" and out[1][1].text == "text about b"
    _Handler.shape = "spader"
    assert HTTPRetriever(server).batch_search(["q"], 5)[0][0].title == "T q"
    _Handler.fails = 5
    with pytest.raises(RuntimeError, match="failed after 2 attempts"):
        HTTPRetriever(server, retries=1, backoff_s=0.01).batch_search(["q"], 1)
    _Handler.fails = 0


def test_http_failure_becomes_error_observation():
    from rllib_spear.envs import make_env

    env = make_env("search_qa", retriever_url="http://127.0.0.1:9/retrieve",
                   retriever_kwargs={"timeout_s": 0.5, "retries": 1, "backoff_s": 0.01})
    env.reset({"question": "q?", "golden_answers": ["a"]})
    res = env.step("<search>x</search>")
    assert res.observation.startswith("<information>Error: search failed") and not res.done
