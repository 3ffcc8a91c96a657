"""Memory and time of the wiki-18 path: convert a JSONL corpus, build the streaming BM25 index,
serve queries from the memory-mapped index; each figure extrapolated linearly to wiki-18's 21M.

    python benchmarks/bm25_index_memory.py [--passages 1000000] [--workdir DIR] [--keep]

A synthetic wiki-18-style JSONL is written first (streamed to disk, seeded): ``{"id", "contents":
"\\"Title\\"\\nTitle text ..."}`` with ~100-word passages (normal, sd 10) drawn from a two-regime
Zipf vocabulary (frequency ~1/r for the first 10k ranks, the first of them English stopwords, then
~r^-1.7: ~1.1M distinct terms at 1M passages, ~7M expected at 21M), a tenth of each passage's words
repeating its 5 topic words. Then, each in its own process so that its peak is its own:
``rllib-spear convert-corpus``, the index build (``BM25Retriever`` on a cold cache) and a server
(loads the index, answers 100 queries: the index part alone, then with the passages).

Per phase: seconds, peak RSS growth over the process's RSS after its imports (VmHWM, and the peak
of anonymous memory sampled every 50 ms: the file-backed rest is page cache the kernel may reclaim,
e.g. the memory-mapped index arrays being written), and for the server its RSS after the queries.
Linear extrapolation overstates the vocabulary's share (a real vocabulary grows sublinearly) and is
otherwise what the build's per-passage arrays scale as. docs/retrieval.md has the measured figures.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

WIKI18 = 21_015_324  # passages of Search-R1's wiki-18.jsonl
_STOP = ["the", "of", "and", "in", "to", "was", "is", "for", "on", "as", "by", "with", "he", "at",
         "from", "his", "an", "it", "that", "which", "were", "are", "also", "be", "this", "or", "has",
         "had", "its", "first", "after", "one", "their", "new", "two", "her", "who", "they", "but"]


_HEAD = 10_000  # ranks with frequency ~ 1/r; beyond, ~ r^-_TAIL (the two regimes of word frequencies)
_TAIL = 1.7  # expected vocabulary: 0.12M words at 2M tokens, 1.2M at 100M (1M passages), 7M at wiki-18's 2.1G


def word(rank: int) -> str:
    """The word of a frequency rank (0-based): English stopwords first, then unique pseudo-words
    of 2-letter syllables, every 50th a year-like number (those repeat)."""
    if rank < len(_STOP):
        return _STOP[rank]
    if rank % 50 == 49:
        return str(1000 + rank // 50 % 1100)
    cons, vow = "bcdfghjklmnprstvz", "aeiou"
    out, r = [], rank + 23
    while r:
        r, k = divmod(r, 85)
        out.append(cons[k % 17] + vow[k // 17])
    return "".join(out)


def _ranks(rng, size: int):
    """``size`` ranks: 1/r up to _HEAD, a Pareto tail (exponent _TAIL) beyond."""
    import numpy as np

    head_w = 1.0 / np.arange(1, _HEAD + 1)
    tail_mass = 1.0 / (_TAIL - 1)  # integral of _HEAD^(s-1) r^-s from _HEAD to infinity
    cdf = np.cumsum(head_w) / (head_w.sum() + tail_mass)
    u = rng.random(size)
    out = np.searchsorted(cdf, u).astype(np.int64)
    tail = u >= cdf[-1]
    pareto = _HEAD * rng.random(int(tail.sum())) ** (-1.0 / (_TAIL - 1))
    out[tail] = np.minimum(pareto, 1e15).astype(np.int64)
    return out


def generate(path: Path, n: int, seed: int = 0, block: int = 20_000) -> None:
    """Write ``n`` wiki-18-style lines to ``path``, ``block`` passages at a time. A passage: its
    title (1-3 words), then ~100 words, a tenth of them one of 5 topic words of the passage."""
    import numpy as np

    rng = np.random.default_rng(seed)
    cached = [word(r) for r in range(200_000)]
    w = lambda r: cached[r] if r < 200_000 else word(r)  # noqa: E731
    with open(path, "w", encoding="utf-8") as f:
        for start in range(0, n, block):
            b = min(block, n - start)
            lens = np.clip(rng.normal(100, 10, size=b).astype(int), 20, 180)
            draws = _ranks(rng, int(lens.sum()))
            topic = rng.random(len(draws)) < 0.1
            topics = 1_000 + _ranks(rng, b * 5).reshape(b, 5)
            doc_of = np.repeat(np.arange(b), lens)
            draws[topic] = topics[doc_of[topic], rng.integers(0, 5, size=int(topic.sum()))]
            titles = 100 + _ranks(rng, b * 3).reshape(b, 3)
            pos, lines = 0, []
            for i in range(b):
                title = " ".join(w(int(r)).title() for r in titles[i, : 1 + i % 3])
                body = " ".join(map(w, draws[pos:pos + lens[i]].tolist()))
                pos += lens[i]
                lines.append(json.dumps({"id": str(start + i), "contents": f'"{title}"\n{title} {body}.'},
                                        ensure_ascii=False))
            f.write("\n".join(lines) + "\n")


class _Meter:
    """Baseline RSS now; peak anonymous RSS sampled in a thread; VmHWM at the end."""

    def __init__(self):
        self.base = _status()
        self.peak_anon = self.base["RssAnon"]
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._sample, daemon=True)
        self._t.start()

    def _sample(self):
        while not self._stop.wait(0.05):
            self.peak_anon = max(self.peak_anon, _status()["RssAnon"])

    def done(self) -> dict:
        self._stop.set()
        self._t.join()
        now = _status()
        return {"rss_base_mib": self.base["VmRSS"] / 1024, "rss_anon_base_mib": self.base["RssAnon"] / 1024,
                "peak_growth_mib": (now["VmHWM"] - self.base["VmRSS"]) / 1024,
                "peak_anon_growth_mib": (max(self.peak_anon, now["RssAnon"]) - self.base["RssAnon"]) / 1024,
                "rss_end_mib": now["VmRSS"] / 1024, "rss_anon_end_mib": now["RssAnon"] / 1024,
                "rss_file_end_mib": now["RssFile"] / 1024}


def _status() -> dict[str, int]:
    """kB fields of /proc/self/status."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if v.strip().endswith("kB"):
                out[k] = int(v.split()[0])
    return out


def _phase(name: str, work: Path) -> dict:
    """One phase, run in this (child) process; the baseline is taken after the imports."""
    if name == "generate":
        m, t = _Meter(), time.perf_counter()
        generate(work / "wiki.jsonl", int(os.environ["BENCH_N"]))
        res = m.done()
        return {**res, "seconds": time.perf_counter() - t}
    import numpy as np
    import pyarrow.parquet  # noqa: F401

    from rllib_spear.cli import main
    from rllib_spear.envs import bm25_index
    from rllib_spear.envs.retrieval import BM25Retriever

    bm25_index.tokenize("warm up")  # loads the stopword list
    m, t = _Meter(), time.perf_counter()
    if name == "convert":
        if main(["convert-corpus", str(work / "wiki.jsonl"), str(work / "corpus.parquet"), "--progress-s", "60"]):
            raise SystemExit("convert-corpus failed")
    elif name == "build":
        assert BM25Retriever(work / "corpus.parquet", cache_dir=work / "index").built
    elif name == "serve":
        r = BM25Retriever(work / "corpus.parquet", cache_dir=work / "index")
        assert not r.built
        load_s = time.perf_counter() - t
        rng = np.random.default_rng(1)
        queries = [" ".join(word(int(k)) for k in rng.integers(100, 50_000, size=rng.integers(2, 6)))
                   for _ in range(100)]
        t1 = time.perf_counter()
        for q in queries:  # the index part of a search: term ids, scores of every passage, top 5
            r.search_rows(q, 5)
        t2 = time.perf_counter()
        hits = sum(len(r.search(q, 5)) for q in queries)
        t3 = time.perf_counter()
        res = m.done()
        res.update(seconds=t3 - t, load_s=load_s, score_ms=(t2 - t1) * 10, search_ms=(t3 - t2) * 10,
                   hits=hits, index_mib=sum(f.stat().st_size for f in r.index_dir.iterdir()) / 2**20)
        return res
    else:
        raise SystemExit(f"unknown phase {name!r}")
    res = m.done()
    res["seconds"] = time.perf_counter() - t
    return res


def _run(name: str, work: Path, n: int) -> dict:
    env = dict(os.environ, BENCH_N=str(n), PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, __file__, "--phase", name, "--workdir", str(work)], env=env,
                         check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passages", type=int, default=1_000_000)
    ap.add_argument("--workdir", default=None, help="where the files go (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the files (a later run with the same --workdir and --passages reuses the JSONL)")
    ap.add_argument("--phase", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.phase:
        print(json.dumps(_phase(a.phase, Path(a.workdir))))
        return
    work = Path(a.workdir or tempfile.mkdtemp(prefix="bm25_memory_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        marker = work / "wiki.jsonl.passages"
        res = {}
        if marker.exists() and marker.read_text() == str(a.passages):  # --keep from an earlier run
            print(f"reusing {work / 'wiki.jsonl'}", file=sys.stderr)
        else:
            res["generate"] = _run("generate", work, a.passages)
            marker.write_text(str(a.passages))
        shutil.rmtree(work / "index", ignore_errors=True)  # a cold build
        res.update({p: _run(p, work, a.passages) for p in ("convert", "build", "serve")})
        sizes = {"jsonl_mib": (work / "wiki.jsonl").stat().st_size / 2**20,
                 "parquet_mib": (work / "corpus.parquet").stat().st_size / 2**20}
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    x = WIKI18 / a.passages
    rows = [
        ("passages", a.passages, WIKI18, ""),
        ("JSONL size (MiB)", sizes["jsonl_mib"], sizes["jsonl_mib"] * x, ""),
        ("convert seconds", res["convert"]["seconds"], res["convert"]["seconds"] * x, ""),
        ("convert peak RSS growth (MiB)", res["convert"]["peak_growth_mib"], None, "constant: one row group"),
        ("parquet size (MiB)", sizes["parquet_mib"], sizes["parquet_mib"] * x, ""),
        ("build seconds", res["build"]["seconds"], res["build"]["seconds"] * x, ""),
        ("build peak RSS growth (MiB)", res["build"]["peak_growth_mib"], res["build"]["peak_growth_mib"] * x,
         "incl. page cache of the index being written"),
        ("build peak anonymous growth (MiB)", res["build"]["peak_anon_growth_mib"],
         res["build"]["peak_anon_growth_mib"] * x, "vocabulary + per-passage arrays + one batch"),
        ("index size on disk (MiB)", res["serve"]["index_mib"], res["serve"]["index_mib"] * x, ""),
        ("serve: load seconds", res["serve"]["load_s"], None, "memory-mapped"),
        ("serve: ms per query, index part", res["serve"]["score_ms"], res["serve"]["score_ms"] * x,
         "term ids, N scores, top 5"),
        ("serve: ms per query, with passages", res["serve"]["search_ms"], None, "+ 5 rows from the parquet"),
        ("serve: RSS after 100 queries (MiB)", res["serve"]["rss_end_mib"], None, "of which imports: "
         f"{res['serve']['rss_base_mib']:,.0f}"),
        ("serve: RSS growth (MiB)", res["serve"]["rss_end_mib"] - res["serve"]["rss_base_mib"],
         (res["serve"]["rss_end_mib"] - res["serve"]["rss_base_mib"]) * x, "mostly shared index pages"),
        ("serve: peak anonymous growth (MiB)", res["serve"]["peak_anon_growth_mib"],
         res["serve"]["peak_anon_growth_mib"] * x, "private: mostly constant, + 4 bytes x N"),
    ]
    print(f"{'':38}{'measured':>14}{'x 21.0M':>14}")
    for label, v, ext, note in rows:
        fmt = (lambda y: f"{y:>14,.0f}") if isinstance(v, int) or abs(v) >= 100 else (lambda y: f"{y:>14,.2f}")
        print(f"{label:38}{fmt(v)}{fmt(ext) if ext is not None else ' ' * 14}  {note}")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
