"""The embedded tables are pinned to DATA_VERSION: a generator change that is not accompanied by a
new version would let machines with an older cache train on different data (this happened: v1
caches written before 60 multi-answer questions were added kept 130 questions instead of 180)."""
from __future__ import annotations

import hashlib
import json

import pyarrow.parquet as pq

from rllib_spear.data import generate_all
from rllib_spear.data.generate import DATA_VERSION

#: (rows, sha256 prefix of the rows as sorted JSON) per table, for DATA_VERSION "v2".
PINNED = {
    "corpus": (308, "b814cfeb4c87eb6c"),
    "search_qa_train": (583, "0309ec63c8d0d7ff"),
    "search_qa_test": (147, "bcaa25c3a23f2c3f"),
    "multi_answer_train": (180, "8305cc5707e28e64"),
    "multi_answer_test": (37, "b2f258ff82c8a93c"),
    "code_math_train": (322, "38b10905a61bc2d3"),
    "code_math_test": (78, "e6063d936dc6abc1"),
    "text_game_train": (244, "1866c41248c74631"),
    "text_game_test": (56, "79edbc67a2f0472d"),
}


def test_generated_tables_match_the_data_version(tmp_path):
    assert DATA_VERSION == "v2", "a new DATA_VERSION needs new pins below"
    paths = generate_all(tmp_path)
    got = {}
    for name, path in paths.items():
        rows = pq.read_table(path).to_pylist()
        got[name] = (len(rows), hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()[:16])
    assert got == PINNED, (
        "the embedded data changed: bump DATA_VERSION in rllib_spear/data/generate.py (so that old "
        "caches are not reused) and update PINNED")
