"""wiki-18 JSONL -> corpus parquet (rllib_spear/envs/corpus.py, ``rllib-spear convert-corpus``)."""
import gzip
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rllib_spear.cli import main
from rllib_spear.envs.corpus import CorpusRows, convert_corpus, parse_corpus_line, split_contents
from rllib_spear.envs.retrieval import HTTPRetriever, load_corpus

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "corpus"
TINY = FIXTURES / "wiki18_tiny.jsonl"
BAD = FIXTURES / "wiki18_bad.jsonl"

# (id, title, text) of every passage of wiki18_tiny.jsonl, written out by hand
EXPECTED = [
    ("0", "Evan Morris", "Evan L. Morris (January 30, 1977 \u2013 July 9, 2015) was a lobbyist for Genentech."),
    ("1", '"Weird Al" Yankovic', '"Weird Al" Yankovic is an American singer and parodist.'),
    ("2", "Velmora River", "Velmora River"),  # empty text: the title is the text
    ("3", "Zürich", "Zürich is the largest city in Switzerland."),
    ("4", "東京", "東京 (Tokyo) is the capital of Japan."),
    ("5", "Line test", "first line of the text\nsecond line of the text"),
    ("6", "Integer id", "An id given as a JSON number."),
    ("7", "Copper", "Copper is a soft, malleable metal."),
    ("8", "Plain first line", "no quotes around this title"),
]


def rows(path):
    ids, titles, texts = load_corpus(path)
    return list(zip(ids, titles, texts))


def test_split_contents_wiki18_convention():
    assert split_contents('"Evan Morris"\nEvan L. Morris was') == ("Evan Morris", "Evan L. Morris was")
    assert split_contents('""Weird Al" Yankovic"\ntext') == ('"Weird Al" Yankovic', "text")
    assert split_contents('"T"\na\nb') == ("T", "a\nb")
    assert split_contents('"T"') == ("T", "")
    assert split_contents('"') == ('"', "")


def test_tiny_fixture_converts_to_expected_rows(tmp_path):
    out = tmp_path / "c.parquet"
    stats = convert_corpus(TINY, out, row_group_size=4, progress_every_s=0)
    assert rows(out) == EXPECTED
    assert (stats.lines, stats.written, stats.skipped, stats.blank) == (10, 9, 0, 1)
    pf = pq.ParquetFile(out)
    assert [pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)] == [4, 4, 1]
    assert pf.schema_arrow.names == ["id", "title", "text"]
    assert not list(tmp_path.glob(".*tmp*"))  # the temporary file was renamed into place


def test_gzip_input_limit_and_same_rows_again(tmp_path):
    gz = tmp_path / "wiki-18.jsonl.gz"
    with open(TINY, "rb") as f, gzip.open(gz, "wb") as g:
        shutil.copyfileobj(f, g)
    convert_corpus(gz, tmp_path / "a.parquet", progress_every_s=0)
    convert_corpus(TINY, tmp_path / "b.parquet", progress_every_s=0)
    assert rows(tmp_path / "a.parquet") == rows(tmp_path / "b.parquet") == EXPECTED
    stats = convert_corpus(TINY, tmp_path / "s.parquet", limit=3, progress_every_s=0)
    assert rows(tmp_path / "s.parquet") == EXPECTED[:3] and stats.written == 3 and stats.lines == 3


def test_bad_line_names_its_number_and_leaves_no_output(tmp_path):
    out = tmp_path / "c.parquet"
    with pytest.raises(ValueError, match=r"wiki18_bad.jsonl: line 3: not JSON .*--skip-bad"):
        convert_corpus(BAD, out, progress_every_s=0)
    assert not out.exists() and not list(tmp_path.iterdir())


def test_skip_bad_counts_and_reports(tmp_path):
    out = tmp_path / "c.parquet"
    stats = convert_corpus(BAD, out, skip_bad=True, progress_every_s=0)
    assert (stats.written, stats.skipped) == (4, 2)
    assert [n for n, _ in stats.bad] == [3, 5]
    assert "missing 'contents'" in stats.bad[1][1]
    assert [r[0] for r in rows(out)] == ["0", "1", "3", "5"]


@pytest.mark.parametrize("line, reason", [
    (b'["a"]', "expected a JSON object"),
    (b'{"contents": "x"}', "missing 'id'"),
    (b'{"id": "", "contents": "x"}', "'id' must be a non-empty string"),
    (b'{"id": true, "contents": "x"}', "'id' must be a non-empty string"),
    (b'{"id": "1", "contents": 5}', "'contents' must be a string"),
    (b'{"id": "1", "contents": "\\"\\"\\n  "}', "empty passage"),
    (b'{"id": "1", "contents": "\xff"}', "not UTF-8"),
])
def test_parse_corpus_line_reasons(line, reason):
    with pytest.raises(ValueError, match=reason):
        parse_corpus_line(line)


def test_progress_lines(tmp_path):
    seen = []
    convert_corpus(TINY, tmp_path / "c.parquet", progress_every_s=1e-9, log=seen.append)
    assert seen and all(s.startswith("[convert-corpus] ") and "passages written" in s and "lines/s" in s
                        for s in seen)


def test_cli_subcommand(tmp_path, capsys):
    out = tmp_path / "c.parquet"
    assert main(["convert-corpus", str(TINY), str(out), "--progress-s", "0"]) == 0
    assert rows(out) == EXPECTED
    assert "wrote 9 passages" in capsys.readouterr().out
    assert main(["convert-corpus", str(BAD), str(out), "--progress-s", "0"]) == 2
    assert "line 3" in capsys.readouterr().err
    assert main(["convert-corpus", str(BAD), str(out), "--skip-bad", "--limit", "3", "--progress-s", "0"]) == 0
    printed = capsys.readouterr().out
    assert "wrote 3 passages" in printed and "skipped line 3" in printed
    assert main(["convert-corpus", str(tmp_path / "missing.jsonl"), str(out)]) == 2


def test_corpus_rows_reads_by_index_across_groups(tmp_path):
    out = tmp_path / "c.parquet"
    convert_corpus(TINY, out, row_group_size=2, progress_every_s=0)
    r = CorpusRows(out, cache_groups=1)
    assert len(r) == 9 and r.max_group_rows == 2
    assert [r.row(i) for i in (8, 0, 5, 4, 1)] == [EXPECTED[i] for i in (8, 0, 5, 4, 1)]
    with pytest.raises(IndexError):
        r.row(9)


def test_http_client_keeps_quotes_inside_titles():
    doc = HTTPRetriever._doc({"contents": '""Weird Al" Yankovic"\n"Weird Al" is a singer.'})
    assert (doc.title, doc.text) == ('"Weird Al" Yankovic', '"Weird Al" is a singer.')


def test_benchmark_generator_writes_wiki18_lines(tmp_path):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bm25_index_memory as bench

    bench.generate(tmp_path / "w.jsonl", 30, block=7)
    stats = convert_corpus(tmp_path / "w.jsonl", tmp_path / "w.parquet", progress_every_s=0)
    assert (stats.lines, stats.written) == (30, 30)
    ids, titles, texts = load_corpus(tmp_path / "w.parquet")
    assert ids == [str(i) for i in range(30)]
    assert all(x.startswith(t + " ") and 20 <= len(x.split()) - len(t.split()) <= 181 for t, x in zip(titles, texts))
    assert [bench.word(r) for r in (0, 1, 49)] == ["the", "of", "1000"] and bench.word(39) != bench.word(40)
