"""Search tool: a BM25 retriever over a parquet corpus, an HTTP retriever client, and the
result formatting with a character budget.

Corpus: a parquet file with string columns ``id``, ``title``, ``text`` (read with pyarrow).

:class:`BM25Retriever` uses ``bm25s`` (BM25, Lucene variant, k1=1.5, b=0.75, English stopwords, no
stemming). The index is built once per corpus file and cached on disk under
``<cache>/bm25/<key>/`` where ``<cache>`` is ``$RLLIB_SPEAR_CACHE`` (default
``~/.cache/rllib_spear``) and ``<key>`` hashes the corpus bytes and the BM25 parameters; a
process-wide cache (:func:`get_retriever`) shares one loaded index between every environment
instance of the process. Search only reads the index, so it is safe from many threads.

:class:`HTTPRetriever` talks to a Search-R1 style server: ``POST {url}`` (normally
``http://host:8000/retrieve``) with ``{"queries": [...], "topk": k, "return_scores": false}``; the
reply is ``{"result": [[doc, ...], ...]}`` (Search-R1) or ``{"result": [{"query": q, "documents":
[doc, ...]}, ...]}`` (SPADER); a doc is ``{"contents": "Title\\ntext"}`` or ``{"title", "contents"/
"text"}``. Timeouts and retries with exponential backoff; on final failure the tool answers with an
error observation instead of raising.

Budget: :func:`truncate_round_robin` keeps documents in the order rank 1 of every query, then rank
2, ... while the formatted total stays within ``max_chars``, and stops at the first document that
does not fit (released SPADER server, docs/algorithms.md 3.4).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

__all__ = [
    "Passage",
    "load_corpus",
    "BM25Retriever",
    "top_k_indices",
    "file_sha256",
    "HTTPRetriever",
    "get_retriever",
    "cache_root",
    "truncate_round_robin",
    "format_search_results",
    "TRUNCATION_NOTE",
]

#: Corpora at least this large print a line and progress bars while their index is built.
_BIG_CORPUS = 100_000

TRUNCATION_NOTE = "System Note: Retrieval results truncated at {max_chars} characters."


def cache_root() -> Path:
    """``$RLLIB_SPEAR_CACHE`` or ``~/.cache/rllib_spear``."""
    return Path(os.environ.get("RLLIB_SPEAR_CACHE") or Path.home() / ".cache" / "rllib_spear")


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str


def load_corpus(path: str | os.PathLike) -> tuple[list[str], list[str], list[str]]:
    """Read (ids, titles, texts) from a parquet corpus; ValueError names the file, row and column
    of the first bad value."""
    import pyarrow.parquet as pq

    path = str(path)
    try:
        table = pq.read_table(path)
    except Exception as e:  # noqa: BLE001 - re-raised with the file name
        raise ValueError(f"{path}: cannot read parquet corpus: {e}") from e
    cols = {}
    for c in ("id", "title", "text"):
        if c not in table.column_names:
            raise ValueError(f"{path}: corpus is missing column {c!r} (has {table.column_names})")
        vals = table.column(c).to_pylist()
        for i, v in enumerate(vals):
            if c == "id" and isinstance(v, int) and not isinstance(v, bool):
                vals[i] = v = str(v)
            if not isinstance(v, str) or (c != "title" and not v.strip()):
                raise ValueError(f"{path}: row {i}, column {c!r}: expected a non-empty string, got {v!r}")
        cols[c] = vals
    if not cols["id"]:
        raise ValueError(f"{path}: corpus is empty")
    return cols["id"], cols["title"], cols["text"]


def file_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class BM25Retriever:
    """BM25 (bm25s) over a parquet corpus, index cached on disk. Thread-safe to search."""

    def __init__(self, corpus_path: str | os.PathLike, *, k1: float = 1.5, b: float = 0.75,
                 method: str = "lucene", cache_dir: str | os.PathLike | None = None):
        import bm25s

        self.corpus_path = str(Path(corpus_path).resolve())
        self.ids, self.titles, self.texts = load_corpus(self.corpus_path)
        params = {"k1": k1, "b": b, "method": method, "stopwords": "en", "bm25s": bm25s.__version__,
                  "fmt": 1}
        key = hashlib.sha256(
            (file_sha256(self.corpus_path) + json.dumps(params, sort_keys=True)).encode()
        ).hexdigest()[:20]
        root = Path(cache_dir) if cache_dir else cache_root() / "bm25"
        self.index_dir = root / key
        self._stopwords = "en"
        if (self.index_dir / "params.index.json").exists():
            try:
                self._bm25 = bm25s.BM25.load(str(self.index_dir), load_corpus=False, show_progress=False)
                self.built = False
                return
            except Exception:  # noqa: BLE001 - a broken cache entry is rebuilt
                pass
        docs = [f"{t}\n{x}" if t else x for t, x in zip(self.titles, self.texts)]
        # a Wikipedia-sized corpus takes minutes: say so and show bm25s's own progress bars
        big = len(docs) >= _BIG_CORPUS
        if big:
            print(f"[rllib_spear] building the BM25 index of {len(docs)} passages of {self.corpus_path} "
                  f"(cached under {self.index_dir})", file=sys.stderr, flush=True)
        toks = bm25s.tokenize(docs, stopwords=self._stopwords, show_progress=big)
        self._bm25 = bm25s.BM25(k1=k1, b=b, method=method)
        self._bm25.index(toks, show_progress=big)
        self.built = True
        tmp = root / f".{key}.tmp.{os.getpid()}.{threading.get_ident()}"
        try:
            tmp.mkdir(parents=True, exist_ok=True)
            self._bm25.save(str(tmp), show_progress=False)
            os.replace(tmp, self.index_dir)
        except OSError:
            pass  # read-only cache, or another process won the race: keep the in-memory index
        finally:  # also on Ctrl-C: no half-written index folder is left behind
            shutil.rmtree(tmp, ignore_errors=True)

    def __len__(self) -> int:
        return len(self.ids)

    def passage(self, i: int) -> Passage:
        return Passage(self.ids[i], self.titles[i], self.texts[i])

    def _query_ids(self, query: str) -> list[int]:
        import bm25s

        toks = bm25s.tokenize([query], stopwords=self._stopwords, return_ids=False, show_progress=False)[0]
        return self._bm25.get_tokens_ids(toks)

    def search(self, query: str, top_k: int = 5) -> list[tuple[Passage, float]]:
        """Top-k passages for one query with their scores (best first); [] when no query word is
        in the index."""
        ids = self._query_ids(query)
        if not ids or top_k <= 0:
            return []
        scores = self._bm25.get_scores_from_ids(ids)
        top = top_k_indices(scores, top_k)
        return [(self.passage(int(i)), float(scores[i])) for i in top if scores[i] > 0]

    def batch_search(self, queries: Sequence[str], top_k: int = 5) -> list[list[Passage]]:
        return [[p for p, _ in self.search(q, top_k)] for q in queries]


def top_k_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` highest ``scores``, score descending, equal scores by index ascending.

    The same on every machine: ``np.argpartition`` alone chooses among scores tied with the k-th
    by its CPU-specific SIMD kernel (AVX2 and AVX-512 machines returned different passages for
    most queries of the embedded task, whose BM25 scores tie often), so it only finds the k-th
    score here; every index scoring at least that is a candidate, and the candidates are ordered
    by (-score, index). O(n) plus a sort of the candidates."""
    n = len(scores)
    k = min(int(k), n)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    kth = np.partition(scores, n - k)[n - k]  # a value: the same whatever the kernel
    cand = np.flatnonzero(scores >= kth)
    return cand[np.lexsort((cand, -scores[cand]))][:k]


class HTTPRetriever:
    """Client of a Search-R1 style ``/retrieve`` server (timeouts, retries, backoff)."""

    def __init__(self, url: str, *, timeout_s: float = 10.0, retries: int = 3, backoff_s: float = 0.5,
                 opener: Callable | None = None):
        self.url = url
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._open = opener or urllib.request.urlopen

    @staticmethod
    def _doc(d) -> Passage:
        if isinstance(d, dict) and "document" in d and isinstance(d["document"], dict):
            d = d["document"]
        if not isinstance(d, dict):
            return Passage("", "", str(d))
        title = d.get("title")
        if title is None and isinstance(d.get("meta"), dict):
            title = d["meta"].get("title")
        text = d.get("contents", d.get("text", ""))
        text = "" if text is None else str(text)
        if title is None:  # Search-R1 corpus: first line of contents is the title
            title, _, rest = text.partition("\n")
            text = rest or title
        return Passage(str(d.get("id", "")), str(title).strip('"'), text)

    def batch_search(self, queries: Sequence[str], top_k: int = 5) -> list[list[Passage]]:
        body = json.dumps({"queries": list(queries), "topk": top_k, "return_scores": False}).encode()
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                req = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
                with self._open(req, timeout=self.timeout_s) as resp:
                    payload = json.loads(resp.read().decode("utf-8", "replace"))
                res = payload["result"]
                out = []
                for r in res:
                    docs = r["documents"] if isinstance(r, dict) else r
                    out.append([self._doc(d) for d in docs][:top_k])
                if len(out) != len(queries):
                    raise ValueError(f"server returned {len(out)} results for {len(queries)} queries")
                return out
            except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError) as e:
                last = e
                if attempt < self.retries:
                    time.sleep(self.backoff_s * (2**attempt))
        raise RuntimeError(f"retriever at {self.url} failed after {self.retries + 1} attempts: {last}")


_CACHE: dict[tuple, object] = {}
_CACHE_LOCK = threading.Lock()


def get_retriever(corpus_path: str | os.PathLike | None = None, *, url: str | None = None, **kwargs):
    """Process-wide cached retriever: ``HTTPRetriever(url)`` if ``url`` is given, else a
    ``BM25Retriever`` over ``corpus_path`` (default: the embedded fictional corpus)."""
    if url:
        key = ("http", url, tuple(sorted(kwargs.items())))
    else:
        if corpus_path is None:
            from rllib_spear.data import default_paths

            corpus_path = default_paths()["corpus"]
        p = Path(corpus_path).resolve()
        st = p.stat()
        key = ("bm25", str(p), st.st_mtime_ns, st.st_size, tuple(sorted(kwargs.items())))
    with _CACHE_LOCK:
        r = _CACHE.get(key)
        if r is None:
            r = HTTPRetriever(url, **kwargs) if url else BM25Retriever(corpus_path, **kwargs)
            _CACHE[key] = r
        return r


def truncate_round_robin(results: Sequence[Sequence], max_chars: int | None,
                         length: Callable[[object], int], overhead: int = 0):
    """Keep documents round-robin by rank (rank 1 of every query, then rank 2, ...) while
    ``overhead + sum(length(doc))`` stays <= max_chars; stop at the first one that does not fit.
    Returns (kept per query, truncated?). ``max_chars`` None or <= 0 keeps everything."""
    if not max_chars or max_chars <= 0:
        return [list(r) for r in results], False
    kept: list[list] = [[] for _ in results]
    used = overhead
    depth = max((len(r) for r in results), default=0)
    for rank in range(depth):
        for q, r in enumerate(results):
            if rank >= len(r):
                continue
            n = length(r[rank])
            if used + n > max_chars:
                return kept, True
            kept[q].append(r[rank])
            used += n
    return kept, False


def _doc_line(i: int, p: Passage) -> str:
    return f"Doc {i}(Title: {p.title}) {p.text}\n"


def format_search_results(queries: Sequence[str], results: Sequence[Sequence[Passage]],
                          max_chars: int | None = 10_000, fmt: str = "text") -> str:
    """The tool output for one call (without the wrapping tags).

    ``fmt="text"`` (compact, Search-R1 style ``Doc i(Title: t) text`` lines, with a
    ``Query: q`` header per query when there are several), or ``"json"`` (the released SPADER
    server's ``[{"query": q, "documents": [{"title", "contents"}]}]``). Truncated round-robin by
    rank to ``max_chars`` characters; the SPADER truncation note is appended when something was cut.
    """
    multi = len(queries) > 1
    if fmt == "json":
        skeleton = [{"query": q, "documents": []} for q in queries]
        overhead = len(json.dumps(skeleton, ensure_ascii=False))
        length = lambda p: len(json.dumps({"title": p.title, "contents": p.text}, ensure_ascii=False)) + 2  # noqa: E731
        kept, truncated = truncate_round_robin(results, max_chars, length, overhead)
        out = json.dumps([{"query": q, "documents": [{"title": p.title, "contents": p.text} for p in docs]}
                          for q, docs in zip(queries, kept)], ensure_ascii=False)
    elif fmt == "text":
        headers = [f"Query: {q}\n" if multi else "" for q in queries]
        empty = "No results.\n"
        overhead = sum(len(h) for h in headers) + sum(len(empty) for r in results if not r)
        # document length with its rank label; ranks < 10 assumed for the budget (+1 slack char)
        kept, truncated = truncate_round_robin(results, max_chars, lambda p: len(_doc_line(1, p)) + 1, overhead)
        parts = []
        for h, docs, orig in zip(headers, kept, results):
            body = "".join(_doc_line(i + 1, p) for i, p in enumerate(docs)) or ("" if orig else empty)
            parts.append(h + body)
        out = "".join(parts).rstrip("\n")
    else:
        raise ValueError(f"unknown result format {fmt!r} (text|json)")
    if truncated:
        out += "\n" + TRUNCATION_NOTE.format(max_chars=max_chars)
    return out
