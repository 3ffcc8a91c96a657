"""Property: with the GLOBAL normalizer, accumulating .backward() over any row-wise split into
micro-batches gives the whole-batch loss and gradient, for every aggregation mode (docs/algorithms.md 1.3)."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rllib_spear.core.losses import AGG_MODES, LossNormalizer, PolicyLossConfig, loss_normalizer, policy_loss


@st.composite
def batches(draw):
    b = draw(st.integers(1, 6))
    t = draw(st.integers(1, 7))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(b, t, generator=g) < draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))).double()
    # force some fully masked rows
    for row in draw(st.lists(st.integers(0, b - 1), max_size=2)):
        mask[row] = 0.0
    logp_old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    logp_new = logp_old + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.4
    adv = torch.randn(b, t, generator=g, dtype=torch.float64) * 2
    # random split of the rows into contiguous micro-batches after a random row permutation
    perm = torch.randperm(b, generator=g).tolist()
    cuts = sorted(draw(st.sets(st.integers(1, max(b - 1, 1)), max_size=b - 1))) if b > 1 else []
    bounds = [0, *cuts, b]
    parts = [perm[bounds[i]:bounds[i + 1]] for i in range(len(bounds) - 1) if bounds[i] < bounds[i + 1]]
    return mask, logp_old, logp_new, adv, parts


@settings(max_examples=40, deadline=None)
@given(batches(), st.sampled_from(AGG_MODES), st.booleans(), st.booleans())
def test_microbatch_gradient_equals_whole_batch(batch, mode, dual, shard_normalizer):
    mask, logp_old, logp_new, adv, parts = batch
    cfg = PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode=mode,
                           dual_clip_c=10.0 if dual else None)
    norm = loss_normalizer(mask, t_norm=7.0)
    if shard_normalizer:
        # learners each count their own shard, then all-reduce (sum) the counts
        norm = LossNormalizer.merge(loss_normalizer(mask[rows], 7.0) for rows in parts)

    whole = logp_new.clone().requires_grad_(True)
    loss_whole, _ = policy_loss(whole, logp_old, adv, mask, config=cfg, normalizer=norm)
    loss_whole.backward()

    acc = logp_new.clone().requires_grad_(True)
    total = 0.0
    for rows in parts:
        idx = torch.tensor(rows)
        loss_mb, _ = policy_loss(acc[idx], logp_old[idx], adv[idx], mask[idx], config=cfg, normalizer=norm)
        loss_mb.backward()
        total += loss_mb.item()

    assert abs(total - loss_whole.item()) <= 1e-9 + 1e-9 * abs(loss_whole.item())
    torch.testing.assert_close(acc.grad, whole.grad, atol=1e-6, rtol=0)
    # fully masked rows never get gradient
    assert torch.all(whole.grad[mask.sum(1) == 0] == 0)


def test_per_microbatch_normalizer_would_differ():
    # sanity check that the property is not vacuous: normalizing per micro-batch changes the result
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    lp = torch.zeros(2, 3, dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, 1.0], [4.0, 0.0, 0.0]], dtype=torch.float64)
    cfg = PolicyLossConfig()
    whole, _ = policy_loss(lp, lp, adv, mask, config=cfg, normalizer=loss_normalizer(mask, 3))
    local = sum(policy_loss(lp[[i]], lp[[i]], adv[[i]], mask[[i]], config=cfg,
                            normalizer=loss_normalizer(mask[[i]], 3))[0].item() for i in range(2))
    assert whole.item() == -7.0 / 4  # -(1+1+1+4)/4
    assert local == -1.0 - 4.0  # -(3/3) - (4/1)
