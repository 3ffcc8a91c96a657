"""Hand-computed checks of rllib_spear.core.diversity (SPADER reward, docs/algorithms.md 3.2)."""
import math

import numpy as np
import pytest

from rllib_spear.core.answers import dedupe_gold_entities
from rllib_spear.core.diversity import diversity_step_details, diversity_step_rewards, entities_in_text

W1 = 1.0 + 4.0 * math.exp(0.0)  # N(e) = 1: alpha + beta = 5
W2 = 1.0 + 4.0 * math.exp(-1.0)  # N(e) = 2: 1 + 4/e = 2.471518


# ---- entities_in_text --------------------------------------------------------------------------
GOLD = dedupe_gold_entities(
    [["The Beatles", "Beatles"], ["Paul McCartney"], ["O’Brien"], ["—"], ["beatles"]]
)


def test_gold_dedupe_for_matching():
    # "—" normalizes to "" and is dropped; ["beatles"] duplicates entity 0's alias set
    assert GOLD == [frozenset({"beatles"}), frozenset({"paul mccartney"}), frozenset({"obrien"})]


def test_entities_in_text_aliases_and_normalization():
    assert entities_in_text("Members of THE BEATLES include Paul McCartney.", GOLD) == [0, 1]
    assert entities_in_text("Conan O'Brien hosted.", GOLD) == [2]  # ’ and ' unify, punctuation dropped
    assert entities_in_text("nothing relevant", GOLD) == []
    assert entities_in_text("", GOLD) == []
    # raw alias lists and strings are normalised too; any alias suffices
    assert entities_in_text("the fab four", [["Beatles", "Fab Four"], "Stones"]) == [0]


def test_entities_in_text_is_plain_substring():
    # released semantics: normalized substring, no word boundary ("art" inside "party")
    assert entities_in_text("a party", [["Art"]]) == [0]


def test_entities_in_text_bad_input():
    with pytest.raises(ValueError, match="text"):
        entities_in_text(None, GOLD)


# ---- diversity_step_rewards --------------------------------------------------------------------
# Group "u", |GT| = 4, alpha=1, beta=4, lam=1:
#   T0: step0 finds {0}, step1 finds {0, 1}, step2 (answer) finds {}      Q = [1, 2, 0]
#   T1: step0 finds {0, 2}, step1 finds {2} again                          Q = [1, 1]
#   T2: step0 finds {3, 3} (duplicate inside a step)                       Q = [1]
# N(0) = 2 (T0, T1), N(1) = N(2) = N(3) = 1.
FOUND = [[[0], [0, 1], []], [[0, 2], [2]], [[3, 3]]]
QUERIES = [[1, 2, 0], [1, 1], [1]]
UIDS = ["u", "u", "u"]


def test_diversity_rewards_hand():
    r = diversity_step_rewards(FOUND, QUERIES, UIDS, {"u": 4})
    # T0: step0 new {0}: W2/4 = 0.617879; step1 new {1} (0 seen before): 5/4; step2: 0
    np.testing.assert_allclose(r[0], [W2 / 4, W1 / 4, 0.0])
    # T1: step0 new {0, 2}: (W2 + 5)/4 = 1.867879; step1: 2 again, first discovery only -> 0
    np.testing.assert_allclose(r[1], [(W2 + W1) / 4, 0.0])
    np.testing.assert_allclose(r[2], [W1 / 4])


def test_diversity_rewards_with_tool_cost():
    r = diversity_step_rewards(FOUND, QUERIES, UIDS, [4, 4, 4], tool_cost=0.01)
    # minus c * Q_k / |GT|: 0.01 * [1, 2, 0] / 4
    np.testing.assert_allclose(r[0], [W2 / 4 - 0.0025, W1 / 4 - 0.005, 0.0])
    np.testing.assert_allclose(r[1], [(W2 + W1) / 4 - 0.0025, -0.0025])
    np.testing.assert_allclose(r[2], [W1 / 4 - 0.0025])


def test_rarity_is_within_group_only():
    # the same entity index in another group "v" (|GT| = 2) is counted separately: N = 1 there
    found = FOUND + [[[0]]]
    r = diversity_step_rewards(found, QUERIES + [[0]], UIDS + ["v"], {"u": 4, "v": 2})
    np.testing.assert_allclose(r[3], [W1 / 2])
    np.testing.assert_allclose(r[0], [W2 / 4, W1 / 4, 0.0])  # unchanged


def test_empty_gold_gives_zero_rewards_even_with_cost():
    r = diversity_step_rewards([[[], []]], [[3, 1]], ["w"], {"w": 0}, tool_cost=0.01)
    assert r == [[0.0, 0.0]]


def test_zero_step_trajectory():
    r = diversity_step_rewards([[], [[0]]], [[], [1]], ["g", "g"], [1, 1])
    assert r == [[], [pytest.approx(W1)]]


def test_custom_alpha_beta_lam():
    # two trajectories both find e0: N = 2; alpha=0.5, beta=2, lam=0.5 -> 0.5 + 2 e^{-0.5} = 1.713061
    r = diversity_step_rewards([[[0]], [[0]]], [[0], [0]], [1, 1], [1, 1], alpha=0.5, beta=2.0, lam=0.5)
    assert r[0][0] == pytest.approx(0.5 + 2 * math.exp(-0.5))


def test_details_companion():
    d = diversity_step_details(FOUND, QUERIES, UIDS, {"u": 4}, tool_cost=0.01)
    assert d.new_entities == [[[0], [1], []], [[0, 2], []], [[3]]]
    assert d.num_new == [[1, 1, 0], [2, 0], [1]]
    assert d.total_new() == [2, 2, 1]
    np.testing.assert_allclose(d.rarity_weighted[1], [W2 + W1, 0.0])
    np.testing.assert_allclose(d.tool_cost[0], [0.0025, 0.005, 0.0])
    assert d.entity_frequency == {"u": {0: 2, 1: 1, 2: 1, 3: 1}}
    assert d.num_gold == [4, 4, 4]
    assert d.rewards == diversity_step_rewards(FOUND, QUERIES, UIDS, {"u": 4}, tool_cost=0.01)


def test_numpy_integers_accepted():
    r = diversity_step_rewards([[np.array([0, 1])]], [[np.int64(0)]], ["a"], {"a": np.int64(2)})
    assert r[0][0] == pytest.approx(2 * W1 / 2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(found_per_step=[[[0]]], queries_per_step=[[1, 1]]), "queries_per_step\\[0\\]"),
        (dict(found_per_step=[[[5]]], queries_per_step=[[1]]), "entity index"),
        (dict(found_per_step=[[[0]]], queries_per_step=[[-1]]), "queries_per_step"),
        (dict(found_per_step=[[[0]], [[0]]], queries_per_step=[[1]]), "found_per_step"),
        (dict(num_gold={"other": 3}), "num_gold"),
        (dict(num_gold=[3, 4], uids=["a", "a"], found_per_step=[[[0]], [[0]]], queries_per_step=[[1], [1]]),
         "num_gold differs"),
        (dict(tool_cost=-0.01), "tool_cost"),
        (dict(alpha=float("inf")), "alpha"),
    ],
)
def test_diversity_bad_input(kwargs, match):
    args = dict(found_per_step=[[[0]]], queries_per_step=[[1]], uids=["a"], num_gold={"a": 3})
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        diversity_step_rewards(**args)
