"""A BM25 index built by streaming a corpus, saved as ``.npy`` files and memory-mapped on load.

Scores are bm25s's eager BM25 (the same numbers as ``bm25s.BM25(k1, b, method).index(...)``):
for a query with tokens ``q_1..q_m`` (repeats counted) and document ``d`` of ``|d|`` tokens,

    score(d) = sum_j idf(q_j) * tf(q_j, d) / (tf(q_j, d) + k1 * (1 - b + b * |d| / avgdl))

with the Lucene idf ``ln(1 + (N - df + 0.5) / (df + 0.5))`` (variants in :data:`BM25_VARIANTS`).
Tokens: lower-cased ``\\b\\w\\w+\\b`` words minus bm25s's English stopwords, no stemming.
Each ``(term, document)`` weight is precomputed as float32 (idf float32, the rest in float64,
bm25s's order of operations) and a query sums them in float32, in query-token order.

Build (:func:`build_index`), two passes so that memory is the vocabulary plus one batch:

1. tokenize each batch of documents; assign term ids by first appearance; append the batch's
   ``(term, tf)`` pairs (document-major) and document lengths to scratch files; add the batch's
   document frequencies;
2. with N, avgdl and df known, read the scratch files back in chunks, weigh each pair, and place it
   by a counting sort into the term-major (CSC) arrays: ``indptr`` (int64, cumulative df),
   ``indices`` (int32 document row), ``data`` (float32 weight), written to memory-mapped ``.npy``
   files. Within a term, rows ascend.

The vocabulary is saved sorted by UTF-8 bytes (``vocab.bin`` + ``vocab_offsets.npy`` +
``vocab_ids.npy``) and looked up by binary search, so a loaded index holds no Python dict:
every array is memory-mapped read-only, and the processes of one machine share its pages.
"""
from __future__ import annotations

import importlib.util
import json
import math
import mmap
import os
import re
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from rllib_spear.registry import Registry

__all__ = [
    "INDEX_FORMAT",
    "BM25Variant",
    "BM25_VARIANTS",
    "tokenize",
    "build_index",
    "BM25Index",
    "build_count",
    "print_progress",
]

#: Bumped when the files or the numbers change: part of the cache key of an index.
INDEX_FORMAT = 2
_TOKEN = re.compile(r"(?u)\b\w\w+\b")  # bm25s's (and scikit-learn's) default token pattern
_META = "meta.json"
_BUILDS = 0


def build_count() -> int:
    """How many indexes :func:`build_index` has built in this process (tests check reloads)."""
    return _BUILDS


@lru_cache(maxsize=1)
def _stopwords() -> frozenset[str]:
    """bm25s's ``STOPWORDS_EN``, read from its ``stopwords.py`` (a plain data module) without
    importing the bm25s package: its scoring backends add ~1 s and ~70 MB to every process that
    only searches."""
    spec = importlib.util.find_spec("bm25s")
    if spec is None or spec.origin is None:
        raise ImportError("bm25s is needed for its English stopword list: pip install bm25s")
    file_spec = importlib.util.spec_from_file_location("_bm25s_stopwords", Path(spec.origin).with_name("stopwords.py"))
    module = importlib.util.module_from_spec(file_spec)
    file_spec.loader.exec_module(module)
    return frozenset(module.STOPWORDS_EN)


def tokenize(text: str) -> list[str]:
    """bm25s's tokenizer with ``stopwords="en"`` and no stemmer: lower-case, ``\\b\\w\\w+\\b``,
    stopwords dropped."""
    stop = _stopwords()
    return [w for w in _TOKEN.findall(text.lower()) if w not in stop]


@dataclass(frozen=True)
class BM25Variant:
    """``idf(df, N)`` (a float, computed in Python as bm25s does) and ``weight(idf32, tf, dl,
    avgdl, k1, b)`` -> float32 weights of many ``(term, document)`` pairs at once."""

    idf: Callable[[int, int], float]
    weight: Callable[..., np.ndarray]


BM25_VARIANTS: Registry[BM25Variant] = Registry("BM25 variant", register_hint="BM25_VARIANTS.register")


def _len_norm(dl: np.ndarray, avgdl: np.float64, k1: float, b: float) -> np.ndarray:
    """k1 * ((1 - b) + b * |d| / avgdl), float64, in bm25s's order of operations."""
    return k1 * ((1 - b) + (b * dl.astype(np.float64)) / avgdl)


def _weight_robertson(idf32, tf, dl, avgdl, k1, b):
    # bm25s: tf (float32) / (norm (float64 scalar) + tf) -> float64, times idf (float32), stored as float32
    tf64 = tf.astype(np.float32).astype(np.float64)
    return (idf32.astype(np.float64) * (tf64 / (_len_norm(dl, avgdl, k1, b) + tf64))).astype(np.float32)


def _weight_atire(idf32, tf, dl, avgdl, k1, b):
    # bm25s: the numerator tf * (k1 + 1) stays float32 (a Python float does not widen it)
    num = (tf.astype(np.float32) * np.float32(k1 + 1)).astype(np.float64)
    den = tf.astype(np.float32).astype(np.float64) + _len_norm(dl, avgdl, k1, b)
    return (idf32.astype(np.float64) * (num / den)).astype(np.float32)


def _idf_lucene(df: int, n: int) -> float:
    return math.log(1 + (n - df + 0.5) / (df + 0.5))


def _idf_robertson(df: int, n: int) -> float:
    return math.log(max(1.0, (n - df + 0.5) / (df + 0.5)))


BM25_VARIANTS.register("lucene", BM25Variant(_idf_lucene, _weight_robertson))
BM25_VARIANTS.register("robertson", BM25Variant(_idf_robertson, _weight_robertson))
BM25_VARIANTS.register("atire", BM25Variant(lambda df, n: math.log(n / df), _weight_atire))


@dataclass
class _Scratch:
    """Append-only scratch files of pass 1 (raw little-endian int32)."""

    root: Path

    def __post_init__(self):
        self.files = {n: open(self.root / f"{n}.bin", "wb") for n in ("terms", "tfs", "uniq", "lens")}

    def append(self, **arrays: np.ndarray) -> None:
        for n, a in arrays.items():
            self.files[n].write(np.ascontiguousarray(a, dtype="<i4").tobytes())

    def close(self) -> None:
        for f in self.files.values():
            f.close()


def _pass1(batches: Iterable[Sequence[str]], scratch: _Scratch, progress) -> tuple[list[str], np.ndarray, int, int]:
    """Tokenize every batch; returns (terms in id order, df, number of documents, total tokens).

    Term ids by first appearance, as bm25s assigns them. Speed: a document's words are mapped by
    one C-level ``map(dict.get)``; only unseen words take the Python loop, and stopwords map to
    -1 and are dropped in numpy."""
    import array

    vocab: dict[str, int] = dict.fromkeys(_stopwords(), -1)
    get = vocab.get
    n_terms = 0
    df = np.zeros(0, dtype=np.int64)
    n_docs = total = 0
    for docs in batches:
        flat = array.array("i")
        raw = np.empty(len(docs), dtype=np.int64)  # tokens per document, stopwords included
        for k, doc in enumerate(docs):
            words = _TOKEN.findall(doc.lower())
            ids = list(map(get, words))
            j = -1
            for _ in range(ids.count(None)):  # unseen words, in order (count and index scan in C)
                j = ids.index(None, j + 1)
                i = ids[j] = vocab.setdefault(words[j], n_terms)
                n_terms += i == n_terms
            flat.extend(ids)
            raw[k] = len(ids)
        ids = np.frombuffer(flat, dtype=np.int32).astype(np.int64)
        keep = ids >= 0
        local = np.repeat(np.arange(len(docs), dtype=np.int64), raw)[keep]
        ids = ids[keep]
        lens = np.bincount(local, minlength=len(docs))
        # unique (document, term) pairs, document-major: the tf of each term in each document
        pairs, tfs = np.unique((local << 32) | ids, return_counts=True)
        terms = (pairs & 0xFFFFFFFF).astype(np.int32)
        uniq = np.bincount(pairs >> 32, minlength=len(docs))
        if len(df) < n_terms:  # grow geometrically: one copy per doubling of the vocabulary
            df = np.concatenate([df, np.zeros(max(n_terms - len(df), len(df)), dtype=np.int64)])
        present, count = np.unique(terms, return_counts=True)  # O(batch), not O(vocabulary)
        df[present] += count
        scratch.append(terms=terms, tfs=tfs, uniq=uniq, lens=lens)
        n_docs += len(docs)
        total += int(lens.sum())
        progress(n_docs)
    terms = [w for w, i in vocab.items() if i >= 0]  # insertion order = id order
    return terms, df[:n_terms], n_docs, total


def _save_vocab(terms: list[str], out: Path, chunk: int = 1 << 16) -> None:
    """``vocab.bin``: the terms' UTF-8 bytes sorted; ``vocab_offsets.npy`` (int64, V+1) where each
    starts; ``vocab_ids.npy`` (int32, V) the term id (CSC column) of each sorted term.

    Sorting the ``str`` terms sorts their UTF-8 bytes (UTF-8 keeps code point order); an int64
    argsort and chunked writes keep the extra memory at 16 bytes a term."""
    order = np.argsort(np.array(terms, dtype=object), kind="stable")
    offsets = np.zeros(len(terms) + 1, dtype=np.int64)
    with open(out / "vocab.bin", "wb") as f:
        for a in range(0, len(terms), chunk):
            enc = [terms[i].encode("utf-8") for i in order[a:a + chunk].tolist()]
            offsets[a + 1:a + 1 + len(enc)] = [len(e) for e in enc]
            f.write(b"".join(enc))
    np.cumsum(offsets, out=offsets)
    np.save(out / "vocab_offsets.npy", offsets)
    np.save(out / "vocab_ids.npy", order.astype(np.int32))


def _pass2(scratch: Path, out: Path, variant: BM25Variant, df: np.ndarray, n_docs: int, avgdl: np.float64,
           k1: float, b: float, chunk_docs: int) -> int:
    """Weigh the scratch pairs and counting-sort them into the CSC arrays; returns nnz."""
    uniq_df, inverse = np.unique(df, return_inverse=True)
    idf32 = np.array([variant.idf(int(x), n_docs) for x in uniq_df], dtype=np.float32)[inverse]
    indptr = np.zeros(len(df) + 1, dtype=np.int64)
    np.cumsum(df, out=indptr[1:])
    nnz = int(indptr[-1])
    np.save(out / "indptr.npy", indptr)
    data = np.lib.format.open_memmap(out / "data.npy", mode="w+", dtype=np.float32, shape=(nnz,))
    rows = np.lib.format.open_memmap(out / "indices.npy", mode="w+", dtype=np.int32, shape=(nnz,))
    heads = indptr[:-1].copy()  # next free slot of each term
    with open(scratch / "terms.bin", "rb") as ft, open(scratch / "tfs.bin", "rb") as ff, \
            open(scratch / "uniq.bin", "rb") as fu, open(scratch / "lens.bin", "rb") as fl:
        for d0 in range(0, n_docs, chunk_docs):
            uniq = np.fromfile(fu, dtype="<i4", count=min(chunk_docs, n_docs - d0)).astype(np.int64)
            lens = np.fromfile(fl, dtype="<i4", count=len(uniq))
            m = int(uniq.sum())
            terms = np.fromfile(ft, dtype="<i4", count=m)
            tfs = np.fromfile(ff, dtype="<i4", count=m)
            docs = np.repeat(np.arange(d0, d0 + len(uniq), dtype=np.int32), uniq)
            w = variant.weight(idf32[terms], tfs, np.repeat(lens, uniq), avgdl, k1, b)
            # counting sort by term; stable, so rows stay ascending within a term
            order = np.argsort(terms, kind="stable")
            st = terms[order]
            first = np.flatnonzero(np.r_[True, st[1:] != st[:-1]]) if m else np.zeros(0, np.int64)
            counts = np.diff(np.r_[first, m])
            pos = heads[st] + (np.arange(m) - np.repeat(first, counts))
            data[pos] = w[order]
            rows[pos] = docs[order]
            heads[st[first]] += counts
    if not np.array_equal(heads, indptr[1:]):
        raise RuntimeError("BM25 build: scratch files do not match the document frequencies")
    data.flush()
    rows.flush()
    del data, rows
    return nnz


def build_index(batches: Iterable[Sequence[str]], out_dir: str | os.PathLike, *, k1: float = 1.5,
                b: float = 0.75, method: str = "lucene", chunk_docs: int = 8192,
                progress: Callable[[int], None] | None = None) -> dict:
    """Build the index of the documents yielded batch by batch into the empty folder ``out_dir``
    (its ``meta.json`` is written last). ``progress(documents tokenized so far)`` is called
    after each batch. Returns the metadata."""
    global _BUILDS
    variant = BM25_VARIANTS.get(method)
    out = Path(out_dir)
    scratch = out / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    files = _Scratch(scratch)
    try:
        terms, df, n_docs, total = _pass1(batches, files, progress or (lambda n: None))
    finally:
        files.close()
    if n_docs == 0:
        raise ValueError("BM25 build: the corpus has no documents")
    _save_vocab(terms, out)
    n_terms = len(terms)
    del terms  # the biggest Python object of the build: pass 2 does not need it
    avgdl = np.float64(total) / n_docs  # = mean of the lengths, exactly (an integer sum < 2**53)
    nnz = _pass2(scratch, out, variant, df, n_docs, avgdl, k1, b, chunk_docs) if total else _empty(out, n_terms)
    for f in scratch.iterdir():
        f.unlink()
    scratch.rmdir()
    meta = {"format": INDEX_FORMAT, "num_docs": n_docs, "num_terms": n_terms, "nnz": nnz,
            "avg_doc_len": float(avgdl), "k1": k1, "b": b, "method": method, "stopwords": "en"}
    (out / _META).write_text(json.dumps(meta, indent=1))
    _BUILDS += 1
    return meta


def _empty(out: Path, n_terms: int) -> int:
    np.save(out / "indptr.npy", np.zeros(n_terms + 1, dtype=np.int64))
    np.save(out / "data.npy", np.zeros(0, dtype=np.float32))
    np.save(out / "indices.npy", np.zeros(0, dtype=np.int32))
    return 0


class BM25Index:
    """A saved index, memory-mapped read-only. Thread-safe (it is never written)."""

    def __init__(self, index_dir: str | os.PathLike):
        d = Path(index_dir)
        self.meta = json.loads((d / _META).read_text())
        if self.meta.get("format") != INDEX_FORMAT:
            raise ValueError(f"{d}: BM25 index format {self.meta.get('format')}, expected {INDEX_FORMAT}")
        self.num_docs = int(self.meta["num_docs"])
        load = lambda name: np.load(d / name, mmap_mode="r")  # noqa: E731
        self.indptr, self.indices, self.data = load("indptr.npy"), load("indices.npy"), load("data.npy")
        self._offsets, self._ids = load("vocab_offsets.npy"), load("vocab_ids.npy")
        with open(d / "vocab.bin", "rb") as f:
            size = os.fstat(f.fileno()).st_size
            self._vocab = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else b""

    def __len__(self) -> int:
        return self.num_docs

    def term_id(self, token: str) -> int | None:
        """The column of ``token`` (binary search in the sorted vocabulary), None if absent."""
        key = token.encode("utf-8")
        lo, hi = 0, len(self._ids)
        off, vocab = self._offsets, self._vocab
        while lo < hi:
            mid = (lo + hi) // 2
            if vocab[int(off[mid]):int(off[mid + 1])] < key:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(self._ids) and vocab[int(off[lo]):int(off[lo + 1])] == key:
            return int(self._ids[lo])
        return None

    def query_ids(self, query: str) -> list[int]:
        """Term ids of the query's tokens in order, repeats kept, unknown tokens dropped."""
        return [t for t in map(self.term_id, tokenize(query)) if t is not None]

    def scores(self, term_ids: Sequence[int]) -> np.ndarray:
        """float32 BM25 score of every document: the weights of each term added in order."""
        out = np.zeros(self.num_docs, dtype=np.float32)
        for t in term_ids:
            s, e = int(self.indptr[t]), int(self.indptr[t + 1])
            out[self.indices[s:e]] += self.data[s:e]  # rows are distinct within a term
        return out


def print_progress(total: int, label: str, every_s: float = 10.0) -> Callable[[int], None]:
    """A ``progress`` callback printing ``label: done/total passages (rate/s)`` to stderr at most
    every ``every_s`` seconds, and once at the end."""
    t0 = last = time.monotonic()

    def report(done: int) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last >= every_s or done >= total:
            last = now
            print(f"{label}: {done:,}/{total:,} passages tokenized ({done / max(now - t0, 1e-9):,.0f}/s)",
                  file=sys.stderr, flush=True)

    return report
