"""Checks of the existing rllib_spear.core.answers module."""
import pytest

from rllib_spear.core.answers import (
    dedupe_gold_entities,
    exact_match,
    normalize_answer,
    set_precision_recall_f1,
    token_f1,
)


@pytest.mark.parametrize(
    "raw, norm",
    [
        ("The  O’Brien—Smith!", "obriensmith"),  # docstring example: dash removed, no space left
        ("A Tale of Two Cities", "tale of two cities"),
        ("an apple, the pear; a fig", "apple pear fig"),
        ("“Quoted”  ‘single’ `tick`", "quoted single tick"),
        ("Rock–Paper‐Scissors", "rockpaperscissors"),  # en dash and hyphen U+2010
        ("theatre anthem", "theatre anthem"),  # articles only as whole words
        ("   ", ""),
        ("—", ""),
        ("Über  CAFÉ", "über café"),
    ],
)
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


def test_normalize_answer_non_str_and_idempotent():
    assert normalize_answer(1984) == "1984"
    for s in ["The  O’Brien—Smith!", "a an the", "It's a-ok"]:
        assert normalize_answer(normalize_answer(s)) == normalize_answer(s)


def test_exact_match():
    assert exact_match("the Beatles!", ["Beatles", "Fab Four"]) == 1.0
    assert exact_match("Beatle", ["Beatles"]) == 0.0
    assert exact_match("x", []) == 0.0


def test_token_f1_hand():
    # p = [cat, sat], g = [cat, sat, on, mat]: common 2, P = 1, R = 0.5, F1 = 2*0.5/1.5 = 2/3
    assert token_f1("the cat sat", ["cat sat on the mat"]) == pytest.approx(2 / 3)
    # max over golds
    assert token_f1("cat", ["dog", "cat"]) == 1.0
    # multiset intersection: p = [a1, a1], g = [a1]: common 1, P = 1/2, R = 1 -> 2/3
    assert token_f1("x x", ["x"]) == pytest.approx(2 / 3)
    assert token_f1("nothing", ["else"]) == 0.0


def test_dedupe_gold_entities():
    gold = [["The Beatles", "Beatles"], ["beatles."], "Paul", ["", "—"], ["Paul"], ["Ringo", "Ringo Starr"]]
    assert dedupe_gold_entities(gold) == [
        frozenset({"beatles"}),  # the second entry has the same normalized alias set
        frozenset({"paul"}),  # "Paul" (str) and ["Paul"] merge
        frozenset({"ringo", "ringo starr"}),
    ]
    assert dedupe_gold_entities([]) == []


def test_set_prf_hand():
    gold = [["The Beatles", "Beatles"], ["Paul McCartney", "Paul"], ["Ringo"]]
    # preds {beatles, stones, paul}: recall = 2/3 entities matched; precision = 2/3 preds correct
    p, r, f = set_precision_recall_f1(["Beatles", "Stones", "Paul"], gold)
    assert (p, r) == (pytest.approx(2 / 3), pytest.approx(2 / 3))
    assert f == pytest.approx(2 / 3)
    # duplicates after normalization count once; two aliases of one entity: both precise, recall 1/3
    p, r, f = set_precision_recall_f1(["the beatles", "Beatles!", "Ringo"], gold)
    assert (p, r) == (1.0, pytest.approx(2 / 3))
    p, r, f = set_precision_recall_f1(["Paul", "Paul McCartney"], gold)
    assert (p, r) == (1.0, pytest.approx(1 / 3))
    assert f == pytest.approx(2 * (1 / 3) / (4 / 3))  # 0.5


def test_set_prf_empty():
    assert set_precision_recall_f1([], [["a"]]) == (0.0, 0.0, 0.0)
    assert set_precision_recall_f1(["a"], []) == (0.0, 0.0, 0.0)
    assert set_precision_recall_f1(["", "—"], [["a"]]) == (0.0, 0.0, 0.0)
    assert set_precision_recall_f1(["x"], [["a"]]) == (0.0, 0.0, 0.0)


def test_none_normalises_to_empty_and_never_matches_the_word_none():
    assert normalize_answer(None) == ""
    assert exact_match(None, ["none"]) == 0.0
    assert exact_match("none", [None]) == 0.0
    assert token_f1(None, ["none"]) == 0.0
