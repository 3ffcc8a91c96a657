"""Checks of rllib_spear.core.filters (Dr.BoT filters, docs/algorithms.md 1.5)."""
import numpy as np
import pytest

from rllib_spear.core.filters import (
    group_std_filter,
    has_repetitive_ngram,
    is_overlong,
    is_unreadable,
    response_filter_reasons,
)


# ---- repetitive n-grams ----------------------------------------------------------------------
def test_repetitive_small_n():
    ids = [1, 2] * 10  # 2-grams: (1,2) x10, (2,1) x9
    assert has_repetitive_ngram(ids, n=2, min_count=10)
    assert not has_repetitive_ngram(ids, n=2, min_count=11)


def test_repetitive_default_20_gram_10_times():
    pattern = list(range(100, 120))  # 20 distinct ids
    assert has_repetitive_ngram(pattern * 10)  # every rotation of the pattern occurs 10 times
    assert not has_repetitive_ngram(pattern * 9 + pattern[:19])  # the top 20-gram occurs 9 times
    # constant run: 29 tokens hold 29 - 20 + 1 = 10 overlapping 20-grams; 28 tokens hold 9
    assert has_repetitive_ngram([7] * 29)
    assert not has_repetitive_ngram([7] * 28)


def test_repetitive_short_and_numpy_input():
    assert not has_repetitive_ngram([], n=20)
    assert not has_repetitive_ngram([1] * 19, n=20, min_count=1)
    assert has_repetitive_ngram(np.array([5] * 20), n=20, min_count=1)


def test_repetitive_bad_args():
    with pytest.raises(ValueError, match="n must"):
        has_repetitive_ngram([1, 2], n=0)
    with pytest.raises(ValueError, match="min_count"):
        has_repetitive_ngram([1, 2], min_count=0)


# ---- unreadable / overlong ---------------------------------------------------------------------
def test_unreadable():
    assert is_unreadable("caf\ufffd au lait")
    assert is_unreadable("mojibake ï¿½ here")  # U+FFFD's UTF-8 bytes read as Latin-1
    assert not is_unreadable("café – “quoted” ü 中文")
    assert not is_unreadable("")
    with pytest.raises(ValueError, match="text"):
        is_unreadable(b"\xff")


def test_overlong():
    assert is_overlong(512, 512)
    assert is_overlong(600, 512)
    assert not is_overlong(511, 512)
    assert not is_overlong(0, 512)  # zero-length response
    with pytest.raises(ValueError, match="max_response_tokens"):
        is_overlong(3, 0)
    with pytest.raises(ValueError, match="num_response_tokens"):
        is_overlong(-1, 5)


def test_response_filter_reasons_order_and_subset():
    assert response_filter_reasons([1, 2, 3], "ok", reached_max_length=False, has_valid_answer=True) == []
    reasons = response_filter_reasons([9] * 30, "bad \ufffd", reached_max_length=True, has_valid_answer=False)
    assert reasons == ["overlong", "incomplete", "repetitive", "unreadable"]
    assert response_filter_reasons([], "", reached_max_length=False, has_valid_answer=False) == ["incomplete"]
    assert response_filter_reasons([1, 1, 1], "x", reached_max_length=False, has_valid_answer=True,
                                   n=1, min_count=3) == ["repetitive"]


# ---- group std filter --------------------------------------------------------------------------
def test_group_std_filter_floor_and_tie_break():
    # population stds: a=[0,0] 0, b=[0,1] 0.5, c=[0,2] 1, d=[1,1] 0.
    # keep floor(0.75 * 4) = 3 groups: c, b, then the tie a/d goes to the uid seen first.
    rewards = [0, 0, 0, 1, 0, 2, 1, 1]
    uids = ["a", "a", "b", "b", "c", "c", "d", "d"]
    assert group_std_filter(rewards, uids) == {"a", "b", "c"}
    order = [6, 7, 0, 1, 2, 3, 4, 5]  # now d appears first
    assert group_std_filter(np.array(rewards)[order], np.array(uids)[order].tolist()) == {"d", "b", "c"}


def test_group_std_filter_rounds_down_like_released_code():
    # 5 groups x 0.75 = 3.75 -> 3 (int() in the released _filter_rollout), not 4
    rewards, uids = [], []
    for g, spread in enumerate([0.0, 1.0, 2.0, 3.0, 4.0]):
        rewards += [0.0, spread]
        uids += [g, g]
    assert group_std_filter(rewards, uids) == {4, 3, 2}


def test_group_std_filter_at_least_one_group_and_keep_all():
    assert group_std_filter([1.0, 2.0], ["only", "only"]) == {"only"}  # floor(0.75) = 0 -> 1
    assert group_std_filter([1.0, 2.0, 3.0], ["a", "b", "c"], keep_fraction=1.0) == {"a", "b", "c"}


def test_group_std_filter_uses_population_std():
    # x = [0, 1]: population 0.5 (unbiased 0.707); y = [0, 0, 1.2]: population 0.566 (unbiased 0.693)
    # keep 1 of 2: population std picks y (unbiased would pick x)
    assert group_std_filter([0.0, 1.0, 0.0, 0.0, 1.2], ["x", "x", "y", "y", "y"], keep_fraction=0.5) == {"y"}


def test_group_std_filter_bad_input():
    with pytest.raises(ValueError, match="keep_fraction"):
        group_std_filter([1.0], ["a"], keep_fraction=0.0)
    with pytest.raises(ValueError, match="keep_fraction"):
        group_std_filter([1.0], ["a"], keep_fraction=1.5)
    with pytest.raises(ValueError, match="rewards is empty"):
        group_std_filter([], [])
    with pytest.raises(ValueError, match="uids"):
        group_std_filter([1.0, 2.0], ["a"])
