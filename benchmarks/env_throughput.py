"""Environment throughput: BM25 queries/s on a generated 100k-passage corpus, and sandboxed Python
executions/s.

    python benchmarks/env_throughput.py [--passages 100000] [--queries 2000] [--execs 60]

Everything is generated locally (seeded) in a temporary directory; a few minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import random
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def make_corpus(path: Path, n: int, seed: int = 0) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rllib_spear.data.generate import FIRST, LAST, MATERIALS, OCCUPATIONS, THINGS, TOWN_A, TOWN_B

    rng = random.Random(seed)
    syll = ["ka", "lo", "mi", "ren", "dor", "sa", "vel", "tin", "qua", "bri", "ost", "um", "ph", "zel"]
    towns = [a + b for a in TOWN_A for b in TOWN_B] + ["".join(rng.choice(syll) for _ in range(3)).title()
                                                     for _ in range(3000)]
    ids, titles, texts, names = [], [], [], []
    for i in range(n):
        name = f"{rng.choice(FIRST)} {rng.choice(LAST)} {''.join(rng.choice(syll) for _ in range(2)).title()}"
        town = rng.choice(towns)
        text = (f"{name} was a {rng.choice(OCCUPATIONS)} born in {town} in {rng.randrange(1500, 2000)}. "
                f"{name} invented the {rng.choice(MATERIALS)} {rng.choice(THINGS)} and lived near the "
                f"{rng.choice(syll).title()}{rng.choice(syll)} river with {rng.randrange(2, 9)} children.")
        ids.append(f"p{i}")
        titles.append(name)
        texts.append(text)
        names.append(name)
    pq.write_table(pa.table({"id": ids, "title": titles, "text": texts}), path)
    return names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passages", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--execs", type=int, default=60)
    a = ap.parse_args()

    from rllib_spear.envs.retrieval import BM25Retriever, format_search_results
    from rllib_spear.envs.sandbox import PythonSandbox

    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        t = time.perf_counter()
        names = make_corpus(d / "corpus.parquet", a.passages)
        print(f"corpus: {a.passages} passages generated in {time.perf_counter() - t:.1f} s")
        t = time.perf_counter()
        r = BM25Retriever(d / "corpus.parquet", cache_dir=d / "idx")
        print(f"bm25 index build (bm25s): {time.perf_counter() - t:.1f} s")
        t = time.perf_counter()
        BM25Retriever(d / "corpus.parquet", cache_dir=d / "idx")
        print(f"bm25 index load from disk cache: {time.perf_counter() - t:.2f} s")
        rng = random.Random(1)
        queries = [f"{rng.choice(names)} born" for _ in range(a.queries)]
        t = time.perf_counter()
        for q in queries:
            r.search(q, 5)
        dt = time.perf_counter() - t
        print(f"bm25 top-5: {len(queries) / dt:.0f} queries/s (1 thread)")
        t = time.perf_counter()
        with ThreadPoolExecutor(2) as ex:
            list(ex.map(lambda q: r.search(q, 5), queries))
        dt = time.perf_counter() - t
        print(f"bm25 top-5: {len(queries) / dt:.0f} queries/s (2 threads)")
        t = time.perf_counter()
        for i in range(0, len(queries), 4):
            qs = queries[i : i + 4]
            format_search_results(qs, r.batch_search(qs, 5), 10_000)
        dt = time.perf_counter() - t
        print(f"search tool call (4 queries, top-5, 10k-char budget, formatted): {len(queries) / 4 / dt:.0f} calls/s")

    sb = PythonSandbox()
    code = "print(sum(i * i for i in range(1000)))"
    sb.run(code)
    t = time.perf_counter()
    for _ in range(a.execs):
        assert sb.run(code).ok
    dt = time.perf_counter() - t
    print(f"sandbox ({sb.backend}): {a.execs / dt:.1f} executions/s sequential, {1000 * dt / a.execs:.0f} ms each")
    t = time.perf_counter()
    with ThreadPoolExecutor(4) as ex:
        assert all(res.ok for res in ex.map(lambda _: sb.run(code), range(a.execs)))
    dt = time.perf_counter() - t
    print(f"sandbox ({sb.backend}): {a.execs / dt:.1f} executions/s with 4 threads")


if __name__ == "__main__":
    main()
