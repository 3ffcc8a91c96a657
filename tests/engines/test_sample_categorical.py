"""The HF engine's categorical draw (exponential race) has the distribution of the probabilities,
never picks a zero-probability token, and is reproducible for a seed."""
from __future__ import annotations

import torch

from rllib_spear.env_runners.engines.hf_engine import sample_categorical


def test_frequencies_match_the_probabilities():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    n = 200_000
    g = torch.Generator().manual_seed(0)
    draws = sample_categorical(p.expand(n, -1).contiguous(), g)
    freq = torch.bincount(draws, minlength=5).double() / n
    # binomial standard error <= sqrt(0.25 / n) = 1.1e-3: 5 sigma
    assert torch.allclose(freq, p.double(), atol=5.6e-3), freq
    assert int((draws == 4).sum()) == 0  # probability 0: never


def test_unnormalised_rows_and_zero_entries():
    probs = torch.tensor([[2.0, 0.0, 2.0], [0.0, 0.0, 7.0]])
    g = torch.Generator().manual_seed(1)
    out = torch.stack([sample_categorical(probs, g) for _ in range(2000)])
    assert set(out[:, 0].tolist()) == {0, 2} and set(out[:, 1].tolist()) == {2}
    assert abs(float((out[:, 0] == 0).double().mean()) - 0.5) < 0.05


def test_seeded_draws_repeat():
    probs = torch.softmax(torch.randn(8, 100, generator=torch.Generator().manual_seed(2)), -1)
    a = sample_categorical(probs, torch.Generator().manual_seed(3))
    b = sample_categorical(probs, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
