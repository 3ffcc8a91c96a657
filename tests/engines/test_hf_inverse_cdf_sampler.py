"""HFEngine's inverse-CDF sampler (``sample_categorical``): the categorical distribution of its
rows, never a token of zero mass (top-k/top-p masks, -inf logits), one seeded uniform per row."""
from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2

from rllib_spear.env_runners.engines.base import SamplingConfig
from rllib_spear.env_runners.engines.hf_engine import apply_top_k_top_p, sample_categorical

DRAWS = 20_000


def _frequencies(probs: torch.Tensor, seed: int) -> torch.Tensor:
    """Counts of ``DRAWS`` draws from the one-row distribution ``probs`` (all rows in one call)."""
    gen = torch.Generator().manual_seed(seed)
    draws = sample_categorical(probs.expand(DRAWS, -1).contiguous(), gen)
    return torch.bincount(draws, minlength=probs.shape[-1])


def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's test over the tokens of nonzero mass: X^2 = sum (O - E)^2 / E, E = n p."""
    keep = probs > 0
    expected = probs[keep].double() * counts.sum()
    stat = float(((counts[keep].double() - expected) ** 2 / expected).sum())
    return float(chi2.sf(stat, int(keep.sum()) - 1))


LOGITS = torch.tensor([[2.0, 1.0, 0.5, float("-inf"), 0.0, -1.0, 3.0, -3.0, 0.2, -0.5]])


@pytest.mark.parametrize("top_k,top_p", [(-1, 1.0), (5, 1.0), (-1, 0.8), (6, 0.9)])
def test_frequencies_match_the_filtered_softmax(top_k, top_p):
    probs = torch.softmax(apply_top_k_top_p(LOGITS, top_k, top_p), dim=-1)[0]
    counts = _frequencies(probs, seed=top_k + int(100 * top_p))
    assert int(counts[probs == 0].sum()) == 0  # masked and -inf tokens are never drawn
    assert _chi_square_p(counts, probs) > 1e-3


def test_tiny_masses_and_unnormalised_rows():
    # float32 mass of 1e-30 next to the -inf logit: the float64 CDF still separates it, and rows
    # that do not sum to 1 are sampled in proportion
    probs = torch.tensor([0.0, 3.0, 0.0, 1e-30, 1.0, 0.0])
    counts = _frequencies(probs, seed=1)
    assert int(counts[probs == 0].sum()) == 0
    assert _chi_square_p(counts, probs / probs.sum()) > 1e-3


def test_the_largest_uniform_stays_on_a_token_of_mass(monkeypatch):
    # u * C_V rounded up to C_V would index past the vocabulary: clamped to the last token of mass
    probs = torch.tensor([[0.25, 0.75, 0.0, 0.0]], dtype=torch.float64)
    cdf = probs.cumsum(-1)
    assert int(torch.searchsorted(cdf, cdf[:, -1:].contiguous(), right=True)) == 4  # the guarded case
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: torch.ones(shape, dtype=kw.get("dtype")))
    assert sample_categorical(probs, torch.Generator()).tolist() == [1]


def test_one_uniform_per_row_from_the_seeded_generator():
    probs = torch.softmax(torch.randn(7, 50, generator=torch.Generator().manual_seed(3)), dim=-1)
    a = sample_categorical(probs, torch.Generator().manual_seed(11))
    b = sample_categorical(probs, torch.Generator().manual_seed(11))
    assert torch.equal(a, b)
    gen = torch.Generator().manual_seed(11)
    sample_categorical(probs, gen)
    ref = torch.Generator().manual_seed(11)
    torch.rand((7, 1), generator=ref, dtype=torch.float64)
    assert torch.equal(gen.get_state(), ref.get_state())  # exactly 7 uniforms consumed


def test_engine_samples_are_seeded_and_respect_top_k(hf_engine, chat_prompts):
    sc = SamplingConfig(max_new_tokens=10, seed=21, temperature=1.2, top_k=3)
    a = hf_engine.generate(chat_prompts, sc)
    assert [o.token_ids for o in a] == [o.token_ids for o in hf_engine.generate(chat_prompts, sc)]
    for p, o in zip(chat_prompts, a):
        seq = torch.tensor([list(p) + o.token_ids])
        with torch.no_grad():
            logits = hf_engine.model(input_ids=seq).logits[0, len(p) - 1 : -1]
        top3 = logits.topk(3, dim=-1).indices
        assert all(t in row.tolist() for t, row in zip(o.token_ids, top3))
