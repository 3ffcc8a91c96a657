"""Search tool: a BM25 retriever over a parquet corpus, an HTTP retriever client, and the
result formatting with a character budget.

Corpus: a parquet file with string columns ``id``, ``title``, ``text`` (read with pyarrow).

:class:`BM25Retriever` scores as ``bm25s`` does (BM25, Lucene variant, k1=1.5, b=0.75, English
stopwords, no stemming; ``envs/bm25_index.py``). The index is built once per corpus file by
streaming the parquet in batches, saved as ``.npy`` files under ``<cache>/bm25/<key>/`` where
``<cache>`` is ``$RLLIB_SPEAR_CACHE`` (default ``~/.cache/rllib_spear``) and ``<key>`` hashes the
corpus bytes and the BM25 parameters, and memory-mapped on load, so the processes of a machine
share one copy; passage text is read from the parquet only for the hits (``envs/corpus.py``). A
process-wide cache (:func:`get_retriever`) shares one retriever between every environment instance
of the process. Search only reads the index, so it is safe from many threads. docs/retrieval.md
covers wiki-18.

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

import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from rllib_spear.cache_paths import cache_root
from rllib_spear.envs.bm25_index import BM25_VARIANTS, INDEX_FORMAT, BM25Index, build_index, print_progress
from rllib_spear.envs.corpus import CorpusRows, iter_corpus_batches, split_contents, unquote_title

__all__ = [
    "Passage",
    "load_corpus",
    "BM25Retriever",
    "top_k_indices",
    "file_sha256",
    "HTTPRetriever",
    "get_retriever",
    "truncate_round_robin",
    "format_search_results",
    "TRUNCATION_NOTE",
]

#: Corpora at least this large print a line and progress bars while their index is built.
_BIG_CORPUS = 100_000
#: Row groups larger than this make every hit of a big corpus slow to read (docs/retrieval.md).
_BIG_ROW_GROUP = 16_384

TRUNCATION_NOTE = "System Note: Retrieval results truncated at {max_chars} characters."


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str


def load_corpus(path: str | os.PathLike) -> tuple[list[str], list[str], list[str]]:
    """Read (ids, titles, texts) from a parquet corpus into memory; ValueError names the file, row
    and column of the first bad value. Small corpora only: :class:`BM25Retriever` streams."""
    ids: list[str] = []
    titles: list[str] = []
    texts: list[str] = []
    for _, i, t, x in iter_corpus_batches(path):
        ids += i
        titles += t
        texts += x
    return ids, titles, texts


def file_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _corpus_sha256(path: Path, root: Path) -> str:
    """:func:`file_sha256` of the corpus, remembered under ``root/sha256/`` per (path, size,
    mtime): hashing a 10 GB wiki-18 parquet in every env runner would add seconds to each start."""
    st = path.stat()
    memo = root / "sha256" / hashlib.sha256(f"{path}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:32]
    try:
        sha = memo.read_text().strip()
        if len(sha) == 64:
            return sha
    except OSError:
        pass
    sha = file_sha256(path)
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f"{memo.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(sha)
        os.replace(tmp, memo)
    except OSError:
        pass  # read-only cache: hash again next time
    return sha


@contextlib.contextmanager
def _build_lock(root: Path, key: str):
    """An exclusive ``flock`` on ``root/.<key>.lock``: one process (or thread) builds an index
    while the others starting on the same corpus wait and then load it. No lock on a read-only
    cache."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        f = open(root / f".{key}.lock", "a+")
    except OSError:
        yield
        return
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        yield
    finally:
        f.close()  # releases the lock


class _Column(Sequence):
    """A read-only view of one corpus column (rows read on demand)."""

    def __init__(self, rows: CorpusRows, field: int):
        self._rows, self._field = rows, field

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self._rows.row(i if i >= 0 else len(self) + i)[self._field]


class BM25Retriever:
    """BM25 over a parquet corpus (bm25s's scores, docs/retrieval.md). Thread-safe to search.

    The index is built once per corpus file by streaming it (``batch_rows`` rows at a time, see
    ``envs/bm25_index.py``), saved under ``<cache>/bm25/<key>/`` and memory-mapped; passages are
    read from the parquet by row only for the hits (``envs/corpus.py``). ``ids``, ``titles`` and
    ``texts`` are read-only views of the corpus columns, not lists in memory."""

    def __init__(self, corpus_path: str | os.PathLike, *, k1: float = 1.5, b: float = 0.75,
                 method: str = "lucene", cache_dir: str | os.PathLike | None = None,
                 batch_rows: int = 4096):
        BM25_VARIANTS.get(method)  # an unknown method fails here, before any hashing
        path = Path(corpus_path).resolve()
        self.corpus_path = str(path)
        self._rows = CorpusRows(path)  # checks the file and its columns
        root = Path(cache_dir) if cache_dir else cache_root() / "bm25"
        params = {"k1": k1, "b": b, "method": method, "stopwords": "en", "fmt": INDEX_FORMAT}
        key = hashlib.sha256(
            (_corpus_sha256(path, root) + json.dumps(params, sort_keys=True)).encode()
        ).hexdigest()[:20]
        self.index_dir = root / key
        self.built = False
        with _build_lock(root, key):
            if not (self.index_dir / "meta.json").exists():
                self.index_dir = self._build(root, key, k1=k1, b=b, method=method, batch_rows=batch_rows)
                self.built = True
        try:
            self._index = BM25Index(self.index_dir)
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"{self.index_dir}: broken BM25 index ({e}); delete that folder to rebuild it") from e
        if len(self._index) != len(self._rows):
            raise ValueError(f"{self.index_dir}: index of {len(self._index)} passages for a corpus of "
                             f"{len(self._rows)} rows; delete that folder to rebuild it")
        self.ids, self.titles, self.texts = (_Column(self._rows, k) for k in range(3))
        if len(self._rows) >= _BIG_CORPUS and self._rows.max_group_rows > _BIG_ROW_GROUP:
            print(f"[rllib_spear] {self.corpus_path}: row groups of up to {self._rows.max_group_rows} rows; "
                  f"each search hit decodes its whole group: rewrite the file with row_group_size=1024 "
                  f"(what rllib-spear convert-corpus writes)", file=sys.stderr, flush=True)

    def _build(self, root: Path, key: str, *, k1: float, b: float, method: str, batch_rows: int) -> Path:
        """Build into a temporary folder and rename it into place; on a read-only cache, keep it
        in a private temporary folder (removed at exit)."""
        n = len(self._rows)
        progress = None
        # a Wikipedia-sized corpus takes a while: say so and report progress
        if n >= _BIG_CORPUS:
            print(f"[rllib_spear] building the BM25 index of {n} passages of {self.corpus_path} "
                  f"(cached under {root / key}; peak memory: the index plus one batch)",
                  file=sys.stderr, flush=True)
            progress = print_progress(n, "[rllib_spear] BM25 index")
        docs = ([f"{t}\n{x}" if t else x for t, x in zip(titles, texts)]
                for _, _, titles, texts in iter_corpus_batches(self.corpus_path, batch_rows))
        try:
            tmp = root / f".{key}.tmp.{os.getpid()}.{threading.get_ident()}"
            tmp.mkdir(parents=True)
        except OSError:  # read-only cache: a private folder for this process
            tmp = Path(tempfile.mkdtemp(prefix="rllib_spear_bm25_"))
            atexit.register(shutil.rmtree, tmp, True)
            build_index(docs, tmp, k1=k1, b=b, method=method, progress=progress)
            return tmp
        target = root / key
        try:
            build_index(docs, tmp, k1=k1, b=b, method=method, progress=progress)
            if (target / "meta.json").exists():  # another machine on a shared cache finished first
                return target
            shutil.rmtree(target, ignore_errors=True)  # an unfinished entry (no meta.json)
            os.replace(tmp, target)
        finally:  # also on Ctrl-C: no half-written index folder is left behind
            shutil.rmtree(tmp, ignore_errors=True)
        return target

    def __len__(self) -> int:
        return len(self._rows)

    def passage(self, i: int) -> Passage:
        return Passage(*self._rows.row(i))

    def _query_ids(self, query: str) -> list[int]:
        return self._index.query_ids(query)

    def search_rows(self, query: str, top_k: int = 5) -> tuple[np.ndarray, np.ndarray]:
        """(rows, float32 scores) of the top-k passages with a positive score, best first, equal
        scores by row; empty when no query word is in the index."""
        ids = self._query_ids(query)
        if not ids or top_k <= 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        scores = self._index.scores(ids)
        # rank only the passages that contain a query word (ascending rows, so ties still break
        # by row): the same hits as ranking all N, without a partition of N scores
        hit = np.flatnonzero(scores > 0)
        top = hit[top_k_indices(scores[hit], top_k)]
        return top, scores[top]

    def search(self, query: str, top_k: int = 5) -> list[tuple[Passage, float]]:
        """Top-k passages for one query with their scores (best first); [] when no query word is
        in the index."""
        rows, scores = self.search_rows(query, top_k)
        return [(self.passage(int(i)), float(s)) for i, s in zip(rows, scores)]

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
            title, rest = split_contents(text)
            text = rest or title
        return Passage(str(d.get("id", "")), unquote_title(str(title)), text)

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
    server's ``[{"query": q, "documents": [{"title", "contents"}]}]``, indented by 2 as the released
    SPADER tool prints it: ``json.dumps(..., indent=2)`` in ``verl/tools/utils/search_r1_like_utils.py``).
    Truncated round-robin by rank to ``max_chars`` characters; the SPADER truncation note is
    appended when something was cut.
    """
    multi = len(queries) > 1
    if fmt == "json":
        # Exact indent-2 lengths: a document sits 3 levels deep, so its 3 inner line breaks gain 6
        # spaces each (18) and it is joined by ",\n" + 6 spaces (8); a non-empty "documents" list
        # opens on "[\n" + 6 spaces and closes on "\n" + 4 spaces + "]" (+4 over "[]" once the
        # separators are counted per document): output length = the bound when every query has a hit.
        skeleton = [{"query": q, "documents": []} for q in queries]
        overhead = len(json.dumps(skeleton, indent=2, ensure_ascii=False)) + 4 * len(queries)
        length = lambda p: len(json.dumps({"title": p.title, "contents": p.text}, indent=2,  # noqa: E731
                                          ensure_ascii=False)) + 26
        kept, truncated = truncate_round_robin(results, max_chars, length, overhead)
        out = json.dumps([{"query": q, "documents": [{"title": p.title, "contents": p.text} for p in docs]}
                          for q, docs in zip(queries, kept)], indent=2, ensure_ascii=False)
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
