"""The corpus parquet file: its schema, conversion from wiki-18 JSONL, streaming reads and row lookup.

Schema: string columns ``id``, ``title``, ``text`` (an integer ``id`` column is read as strings);
``id`` and ``text`` non-empty, ``title`` may be empty. The BM25 document of a row is
``title + "\\n" + text`` (``text`` alone when the title is empty), see docs/retrieval.md.

wiki-18 (Search-R1's ``wiki-18.jsonl``) has one JSON object a line, ``{"id": "0", "contents":
"\\"Evan Morris\\"\\nEvan L. Morris (January 30, 1977 ..."}``: the first line of ``contents`` is the
title in double quotes, the rest is the text (Search-R1 ``search_r1/search/retrieval_server.py``
splits it the same way). :func:`split_contents` removes one pair of enclosing quotes, so quotes
inside a title survive (``""Weird Al" Yankovic"`` -> ``"Weird Al" Yankovic``; Search-R1's
``strip('"')`` would also drop the title's own closing quote). A passage whose text is empty gets
its title as text (the same rule as the HTTP client in ``envs/retrieval.py``), because the schema
needs a non-empty text; a row with neither is a bad line.

:func:`convert_corpus` streams the JSONL (or ``.jsonl.gz``) line by line into a temporary parquet
file, one row group per ``row_group_size`` rows, and renames it into place at the end, so the
corpus is never held in memory and an interrupted run leaves no partial output. Small row groups
(1024 rows, ~0.6 MB of wiki-18 text, ~2 ms to decode; 4096 rows took ~6 ms) let
:class:`CorpusRows` read one hit's passage without decoding much else; the footer stays small
(no column statistics: ~5 MB for wiki-18's 20k groups). The same input always gives the same rows.
"""
from __future__ import annotations

import bisect
import gzip
import json
import os
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

__all__ = [
    "CORPUS_COLUMNS",
    "unquote_title",
    "split_contents",
    "parse_corpus_line",
    "ConvertStats",
    "convert_corpus",
    "check_corpus_values",
    "iter_corpus_batches",
    "CorpusRows",
]

CORPUS_COLUMNS = ("id", "title", "text")

#: Bad lines kept (line number, reason) for the report of a ``skip_bad`` run.
_MAX_BAD_REPORTED = 10


class BadLine(ValueError):
    """One JSONL line that is not a passage (the reason, without file and line)."""


def unquote_title(title: str) -> str:
    """``title`` without one pair of enclosing double quotes (inner quotes kept)."""
    if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
        return title[1:-1]
    return title


def split_contents(contents: str) -> tuple[str, str]:
    """wiki-18 ``contents`` -> ``(title, text)``: title = the first line without one pair of
    enclosing double quotes, text = everything after the first newline."""
    first, _, rest = contents.partition("\n")
    return unquote_title(first), rest


def _string(obj: dict, key: str) -> str:
    v = obj[key]
    if v is None:
        return ""
    if not isinstance(v, str):
        raise BadLine(f"{key!r} must be a string, got {type(v).__name__}")
    return v


def parse_corpus_line(line: bytes | str) -> tuple[str, str, str]:
    """One JSONL line -> ``(id, title, text)``; :class:`BadLine` says why it is not a passage.

    Accepted rows: wiki-18 ``{"id", "contents"}`` (split by :func:`split_contents`), or rows that
    already have ``title`` and ``text`` (or ``title`` and ``contents``: then ``contents`` is the
    text). ``id`` is a non-empty string or an integer."""
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadLine(f"not UTF-8 ({e.reason} at byte {e.start})") from None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise BadLine(f"not JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise BadLine(f"expected a JSON object, got {type(obj).__name__}")
    if "id" not in obj:
        raise BadLine("missing 'id'")
    pid = obj["id"]
    if isinstance(pid, int) and not isinstance(pid, bool):
        pid = str(pid)
    if not isinstance(pid, str) or not pid.strip():
        raise BadLine(f"'id' must be a non-empty string or an integer, got {pid!r}")
    if "title" in obj and ("text" in obj or "contents" in obj):
        title = _string(obj, "title")
        text = _string(obj, "text" if "text" in obj else "contents")
    elif "contents" in obj:
        title, text = split_contents(_string(obj, "contents"))
    elif "text" in obj:
        title, text = "", _string(obj, "text")
    else:
        raise BadLine(f"missing 'contents' (wiki-18) or 'title' and 'text' (has {sorted(obj)})")
    if not text.strip():
        if not title.strip():
            raise BadLine("empty passage (no title and no text)")
        text = title  # the schema needs a text; the title is all there is to find
    return pid, title, text


@dataclass
class ConvertStats:
    """What :func:`convert_corpus` did: lines read, passages written, bad lines skipped (with
    the first few as ``(line number, reason)``), blank lines ignored, seconds."""

    lines: int = 0
    written: int = 0
    skipped: int = 0
    blank: int = 0
    seconds: float = 0.0
    bad: list[tuple[int, str]] = field(default_factory=list)


def _open_lines(path: Path):
    # binary lines: a bad byte sequence is one bad line, not a crash of the whole read
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")


def convert_corpus(src: str | os.PathLike, dst: str | os.PathLike, *, limit: int | None = None,
                   skip_bad: bool = False, row_group_size: int = 1024, progress_every_s: float = 10.0,
                   log: Callable[[str], None] | None = None) -> ConvertStats:
    """Stream wiki-18 JSONL ``src`` (``.jsonl`` or ``.jsonl.gz``) into the corpus parquet ``dst``.

    ``limit``: stop after that many passages (a sample). ``skip_bad``: count and skip bad lines
    instead of raising ``ValueError`` at the first one (the message names the line). Blank lines
    are ignored. ``log`` gets a progress line every ``progress_every_s`` seconds (lines/s,
    passages written; default: stderr; ``progress_every_s <= 0`` turns it off)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src, dst = Path(src), Path(dst)
    if limit is not None and limit <= 0:
        raise ValueError(f"limit must be a positive number of passages, got {limit}")
    if row_group_size <= 0:
        raise ValueError(f"row_group_size must be positive, got {row_group_size}")
    if not src.is_file():
        raise ValueError(f"{src}: no such corpus file (a wiki-18 style .jsonl or .jsonl.gz)")
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    schema = pa.schema([(c, pa.string()) for c in CORPUS_COLUMNS])
    stats = ConvertStats()
    t0 = last = time.monotonic()
    tmp = dst.with_name(f".{dst.name}.tmp.{os.getpid()}")
    dst.parent.mkdir(parents=True, exist_ok=True)
    # no column statistics: min/max of the text column would put whole passages in the footer
    writer = pq.ParquetWriter(tmp, schema, compression="zstd", write_statistics=False)
    cols: tuple[list[str], list[str], list[str]] = ([], [], [])

    def flush() -> None:
        if cols[0]:
            writer.write_table(pa.Table.from_arrays([pa.array(c, pa.string()) for c in cols], schema=schema),
                               row_group_size=row_group_size)
            for c in cols:
                c.clear()

    try:
        with _open_lines(src) as f:
            for lineno, raw in enumerate(f, 1):
                stats.lines = lineno
                if not raw.strip():
                    stats.blank += 1
                    continue
                try:
                    row = parse_corpus_line(raw)
                except BadLine as e:
                    if not skip_bad:
                        raise ValueError(f"{src}: line {lineno}: {e}; fix or delete that line, or pass "
                                         f"--skip-bad (skip_bad=True) to skip and count bad lines") from None
                    stats.skipped += 1
                    if len(stats.bad) < _MAX_BAD_REPORTED:
                        stats.bad.append((lineno, str(e)))
                    continue
                for c, v in zip(cols, row):
                    c.append(v)
                stats.written += 1
                if len(cols[0]) >= row_group_size:
                    flush()
                if progress_every_s > 0 and time.monotonic() - last >= progress_every_s:
                    last = time.monotonic()
                    log(f"[convert-corpus] {stats.lines:,} lines, {stats.written:,} passages written, "
                        f"{stats.lines / (last - t0):,.0f} lines/s")
                if limit is not None and stats.written >= limit:
                    break
        flush()
        writer.close()
        if stats.written == 0:
            raise ValueError(f"{src}: no passages in {stats.lines} lines (is it a wiki-18 style JSONL?)")
        os.replace(tmp, dst)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    stats.seconds = time.monotonic() - t0
    return stats


def check_corpus_values(path: str, column: str, values: list, first_row: int = 0) -> list:
    """Validate (in place) one column of a batch of corpus rows: strings, ``id``/``text``
    non-empty, integer ids turned into strings. ``ValueError`` names the file, row and column."""
    for i, v in enumerate(values):
        if column == "id" and isinstance(v, int) and not isinstance(v, bool):
            values[i] = v = str(v)
        if not isinstance(v, str) or (column != "title" and not v.strip()):
            raise ValueError(f"{path}: row {first_row + i}, column {column!r}: expected a non-empty "
                             f"string, got {v!r}")
    return values


def _open_parquet(path: str):
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path, memory_map=True)
    except Exception as e:  # noqa: BLE001 - re-raised with the file name
        raise ValueError(f"{path}: cannot read parquet corpus: {e}") from e
    names = pf.schema_arrow.names
    for c in CORPUS_COLUMNS:
        if c not in names:
            raise ValueError(f"{path}: corpus is missing column {c!r} (has {names})")
    if pf.metadata.num_rows == 0:
        raise ValueError(f"{path}: corpus is empty")
    return pf


def iter_corpus_batches(path: str | os.PathLike, batch_rows: int = 4096
                        ) -> Iterator[tuple[int, list[str], list[str], list[str]]]:
    """``(first row, ids, titles, texts)`` for consecutive batches of at most ``batch_rows``
    rows of a corpus parquet, each validated by :func:`check_corpus_values`; only one batch is
    in memory at a time."""
    path = str(path)
    if batch_rows <= 0:
        raise ValueError(f"batch_rows must be positive, got {batch_rows}")
    pf = _open_parquet(path)
    start = 0
    for batch in pf.iter_batches(batch_size=batch_rows, columns=list(CORPUS_COLUMNS)):
        cols = [check_corpus_values(path, c, batch.column(c).to_pylist(), start) for c in CORPUS_COLUMNS]
        yield start, *cols
        start += batch.num_rows


class CorpusRows:
    """Read rows of a corpus parquet by index, one row group at a time (the last
    ``cache_groups`` decoded groups are kept). Thread-safe.

    Row ``i`` lies in the row group whose first row is the largest start <= i; a miss decodes that
    group only, so a corpus written by :func:`convert_corpus` (1024-row groups) costs ~0.6 MB per
    miss, while one written as a single group is decoded whole on the first read."""

    def __init__(self, path: str | os.PathLike, cache_groups: int = 8):
        self.path = str(path)
        self._pf = _open_parquet(self.path)
        md = self._pf.metadata
        self._starts = [0]
        for g in range(md.num_row_groups):
            self._starts.append(self._starts[-1] + md.row_group(g).num_rows)
        self.max_group_rows = max(md.row_group(g).num_rows for g in range(md.num_row_groups))
        self._cache: OrderedDict[int, object] = OrderedDict()
        self._cache_groups = max(1, int(cache_groups))
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._starts[-1]

    def _group(self, g: int):
        table = self._cache.get(g)
        if table is None:
            table = self._pf.read_row_group(g, columns=list(CORPUS_COLUMNS))
            self._cache[g] = table
            if len(self._cache) > self._cache_groups:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(g)
        return table

    def row(self, i: int) -> tuple[str, str, str]:
        """``(id, title, text)`` of row ``i`` (0-based)."""
        if not 0 <= i < len(self):
            raise IndexError(f"row {i} out of range for a corpus of {len(self)} rows")
        g = bisect.bisect_right(self._starts, i) - 1
        with self._lock:  # pyarrow readers and the LRU are not safe to share between threads
            table = self._group(g)
            j = i - self._starts[g]
            pid, title, text = (table.column(c)[j].as_py() for c in CORPUS_COLUMNS)
        return str(pid), title, text
