"""Token-budget micro-batching of the learner and the entropy-metric sample."""
from __future__ import annotations

import torch

from rllib_spear.algorithms.grpo.microbatching import entropy_sample_part as _entropy_sample_part
from rllib_spear.algorithms.grpo.microbatching import token_budget_microbatches as _token_budget_microbatches


def _mask(lengths: list[int]) -> torch.Tensor:
    T = max(lengths)
    return torch.tensor([[1] * L + [0] * (T - L) for L in lengths])


def _padded_tokens(mask: torch.Tensor, parts) -> int:
    lengths = mask.sum(1)
    return sum(int(lengths[p].max()) * len(p) for p in parts)


def test_rows_are_packed_longest_first():
    # lengths 10 50 12 48 30, budget 100 (hand-packed):
    #   longest first: 50, 48 -> 2 x 50 = 100 | 30, 12, 10 -> 3 x 30 = 90
    mask = _mask([10, 50, 12, 48, 30])
    parts = _token_budget_microbatches(mask, 100)
    assert [p.tolist() for p in parts] == [[1, 3], [0, 2, 4]]
    assert _padded_tokens(mask, parts) == 190
    # in batch order the same rows would pad to 100 + 96 + 30 = 226 tokens in three parts


def test_every_row_once_and_budget_respected():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(5, 300, (64,), generator=g).tolist()
    mask = _mask(lengths)
    parts = _token_budget_microbatches(mask, 2048)
    rows = sorted(i for p in parts for i in p.tolist())
    assert rows == list(range(64))
    for p in parts:
        assert len(p) == 1 or max(lengths[i] for i in p.tolist()) * len(p) <= 2048


def test_row_longer_than_budget_is_its_own_part():
    parts = _token_budget_microbatches(_mask([500, 20, 30]), 100)
    assert [p.tolist() for p in parts] == [[0], [1, 2]]


def test_entropy_part_is_drawn_in_proportion_to_tokens():
    mask = _mask([100, 100, 100, 50, 50])
    parts = [torch.tensor([0, 1, 2]), torch.tensor([3, 4])]  # 300 and 100 tokens
    gen = torch.Generator().manual_seed(0)
    draws = [_entropy_sample_part(mask, parts, gen) for _ in range(4000)]
    share = draws.count(0) / len(draws)
    assert abs(share - 0.75) < 0.03
    assert _entropy_sample_part(mask, [torch.tensor([0, 1])], gen) == 0
