"""Embedded default datasets, generated deterministically on first use.

Nothing is downloaded and no parquet is shipped in the repository: :func:`default_paths` runs the
seeded generators of :mod:`rllib_spear.data.generate` once and writes small parquet files
(about 100 KB in all) to ``$RLLIB_SPEAR_DATA_DIR`` if set, else to
``$RLLIB_SPEAR_CACHE/data/<version>-seed<seed>/`` (``RLLIB_SPEAR_CACHE`` defaults to
``~/.cache/rllib_spear``). Files are written to a temporary name and renamed, so concurrent
first uses are safe; the same seed gives identical tables on every machine.

``python -m rllib_spear.data [--out DIR] [--seed N]`` writes them explicitly and prints the paths.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["default_paths", "generate_all", "data_dir", "TABLES"]

TABLES = [
    "corpus",
    "search_qa_train", "search_qa_test",
    "multi_answer_train", "multi_answer_test",
    "code_math_train", "code_math_test",
    "text_game_train", "text_game_test",
]


def data_dir(seed: int = 1234) -> Path:
    from rllib_spear.data.generate import DATA_VERSION
    from rllib_spear.cache_paths import cache_root

    env = os.environ.get("RLLIB_SPEAR_DATA_DIR")
    if env and seed == 1234:
        return Path(env)
    return cache_root() / "data" / f"{DATA_VERSION}-seed{seed}"


def _write(rows: list[dict], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, path)


def generate_all(out_dir: str | os.PathLike, seed: int = 1234) -> dict[str, Path]:
    """Generate every table into ``out_dir``; returns {table: path}."""
    from rllib_spear.data import generate as g

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    w = g.build_world(seed)
    tables = {
        "corpus": g.corpus_rows(w),
        "search_qa": g.search_qa_rows(w, seed),
        "multi_answer": g.multi_answer_rows(w, seed),
        "code_math": g.code_math_rows(seed),
        "text_game": g.text_game_rows(seed),
    }
    paths = {}
    for name, rows in tables.items():
        if name == "corpus":
            paths[name] = out / "corpus.parquet"
            _write(rows, paths[name])
            continue
        for split in ("train", "test"):
            part = [r for r in rows if g.split_of(r["uid"]) == split]
            paths[f"{name}_{split}"] = out / f"{name}_{split}.parquet"
            _write(part, paths[f"{name}_{split}"])
    return paths


def default_paths(seed: int = 1234) -> dict[str, Path]:
    """{table: parquet path} of the embedded datasets, generating them if missing."""
    d = data_dir(seed)
    paths = {t: d / f"{t}.parquet" for t in TABLES}
    if not all(p.exists() for p in paths.values()):
        import sys

        print(f"[rllib_spear] generating the embedded datasets (seed {seed}) under {d}", file=sys.stderr, flush=True)
        generate_all(d, seed)
    return paths
