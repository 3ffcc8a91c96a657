"""Token-budget micro-batching of the learner and the entropy-metric sample."""
from __future__ import annotations

import pytest
import torch

from rllib_spear.learner.microbatching import entropy_metric_sample as _entropy_metric_sample
from rllib_spear.learner.microbatching import token_budget_microbatches as _token_budget_microbatches


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


def test_packed_parts_count_real_tokens():
    # packed_microbatches: a part costs the sum of its rows' real tokens, not rows x longest.
    # lengths 10 50 12 48 30, budget 100, longest first: 50 + 48 = 98 | + 30 > 100: 30 + 12 + 10 = 52
    mask = _mask([10, 50, 12, 48, 30])
    assert [p.tolist() for p in _token_budget_microbatches(mask, 100, packed=True)] == [[1, 3], [0, 2, 4]]
    # budget 60: 50 | 48 | 30 + 12 + 10 = 52 (padded: 30 x 3 = 90 > 60, so 30, 12 -> 2 x 30 | 10: four parts)
    assert [p.tolist() for p in _token_budget_microbatches(mask, 60, packed=True)] == [[1], [3], [0, 2, 4]]
    assert [p.tolist() for p in _token_budget_microbatches(mask, 60)] == [[1], [3], [2, 4], [0]]
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(5, 300, (64,), generator=g).tolist()
    parts = _token_budget_microbatches(_mask(lengths), 2048, packed=True)
    assert sorted(i for p in parts for i in p.tolist()) == list(range(64))
    assert all(sum(lengths[i] for i in p.tolist()) <= 2048 for p in parts)
    assert len(parts) < len(_token_budget_microbatches(_mask(lengths), 2048))  # fuller parts


def test_row_longer_than_budget_is_its_own_part():
    parts = _token_budget_microbatches(_mask([500, 20, 30]), 100)
    assert [p.tolist() for p in parts] == [[0], [1, 2]]


def _loss_mask_and_entropy():
    """3 rows, T = 6: 9 loss tokens (observation gap in row 0, row 2 mostly masked) with
    hand-written entropies; their token mean is 18.0 / 9 = 2.0."""
    loss = torch.tensor([[0, 1, 1, 0, 1, 1],
                         [0, 0, 1, 1, 1, 0],
                         [0, 0, 0, 0, 1, 1]], dtype=torch.float32)
    ent = torch.tensor([[9., 0.5, 1.0, 9., 3.0, 4.0],
                        [9., 9., 0.2, 0.8, 2.5, 9.],
                        [9., 9., 9., 9., 5.0, 1.0]])
    return loss, ent


def test_entropy_sample_mean_is_unbiased():
    loss, ent = _loss_mask_and_entropy()
    gen = torch.Generator().manual_seed(0)
    means = []
    for _ in range(4000):
        pick = _entropy_metric_sample(loss, 2, gen)
        assert int(pick.sum()) == 2 and bool((loss[pick] > 0).all())  # only loss tokens, exactly k
        means.append(float(ent[pick].mean()))
    # full token mean: (0.5+1+3+4 + 0.2+0.8+2.5 + 5+1) / 9 = 2.0; the sample-mean's std is
    # about 1.1 per draw, so 4000 draws put the average within ~0.02 (0.06 is > 3 sigma)
    assert abs(sum(means) / len(means) - 2.0) < 0.06


def test_entropy_sample_is_bounded_and_takes_all_when_fewer():
    loss, _ = _loss_mask_and_entropy()
    gen = torch.Generator().manual_seed(1)
    assert torch.equal(_entropy_metric_sample(loss, 1024, gen), loss > 0)
    big = torch.ones(64, 300)
    assert int(_entropy_metric_sample(big, 1024, gen).sum()) == 1024
    assert int(_entropy_metric_sample(loss, 0, gen).sum()) == 0
    with pytest.raises(ValueError, match="entropy_metric_tokens"):
        _entropy_metric_sample(loss, -1, gen)
