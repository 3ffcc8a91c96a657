"""Hand-computed checks of rllib_spear.core.losses (docs/algorithms.md 1.2-1.4, 1.6)."""
import math

import pytest
import torch

from rllib_spear.core.losses import (
    AGG_MODES,
    LossNormalizer,
    PolicyLossConfig,
    aggregate_token_values,
    kl_penalty,
    loss_normalizer,
    masked_mean,
    policy_loss,
)

D = torch.float64
LN = math.log


def t(rows):
    return torch.tensor(rows, dtype=D)


def make_generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def run(logp_new, logp_old, adv, mask, config, **kw):
    lp = t(logp_new).requires_grad_(True)
    m = t(mask)
    norm = kw.pop("normalizer", None) or loss_normalizer(m, t_norm=kw.pop("t_norm", 10.0))
    loss, metrics = policy_loss(lp, t(logp_old), t(adv), m, config=config, normalizer=norm, **kw)
    loss.backward()
    return loss.item(), metrics, lp.grad


# ---- aggregation -----------------------------------------------------------------------------
VALUES = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]
MASK = [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
# row sums S = [3, 15, 0], counts n = [2, 3, 0]; N_tok = 5, N_seq = 2 (row 2 fully masked); T = 10
EXPECTED = {
    "token-mean": 18 / 5,  # (1+2+4+5+6)/5 = 3.6
    "seq-mean-token-mean": (3 / 2 + 15 / 3) / 2,  # (1.5 + 5)/2 = 3.25
    "seq-mean-token-sum": (3 + 15) / 2,  # 9
    "seq-mean-token-sum-norm": 18 / (10 * 2),  # 0.9
}


def test_loss_normalizer_counts():
    n = loss_normalizer(t(MASK), t_norm=10)
    assert (n.num_tokens, n.num_seqs, n.t_norm) == (5.0, 2.0, 10.0)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregate_modes_hand(mode):
    norm = loss_normalizer(t(MASK), t_norm=10)
    assert aggregate_token_values(t(VALUES), t(MASK), mode, norm).item() == pytest.approx(EXPECTED[mode])


@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregate_microbatches_sum_to_whole(mode):
    norm = loss_normalizer(t(MASK), t_norm=10)
    v, m = t(VALUES), t(MASK)
    parts = [aggregate_token_values(v[rows], m[rows], mode, norm).item() for rows in ([0], [1, 2])]
    assert sum(parts) == pytest.approx(EXPECTED[mode])
    # e.g. token-mean: 3/5 + 15/5 = 3.6; a per-micro-batch normalizer would give 1.5 + 5 = 6.5


def test_aggregate_ignores_garbage_under_mask():
    v = t(VALUES)
    v[2] = float("nan")
    v[0, 2] = float("inf")
    norm = loss_normalizer(t(MASK), t_norm=10)
    assert aggregate_token_values(v, t(MASK), "token-mean", norm).item() == pytest.approx(3.6)


def test_aggregate_all_masked_is_zero_with_graph():
    v = t(VALUES).requires_grad_(True)
    m = torch.zeros(3, 3, dtype=D)
    norm = loss_normalizer(m, t_norm=4)
    assert (norm.num_tokens, norm.num_seqs) == (0.0, 0.0)
    for mode in AGG_MODES:
        out = aggregate_token_values(v, m, mode, norm)
        assert out.item() == 0.0
        out.backward()
        assert torch.all(v.grad == 0)


def test_normalizer_merge():
    m = t(MASK)
    parts = [loss_normalizer(m[:1], 10), loss_normalizer(m[1:], 10)]
    merged = LossNormalizer.merge(parts)
    assert merged == LossNormalizer(5.0, 2.0, 10.0) == parts[0] + parts[1]
    assert LossNormalizer.from_tensor(merged.as_tensor(), 10.0) == merged
    with pytest.raises(ValueError, match="t_norm"):
        parts[0] + loss_normalizer(m[1:], 20)
    with pytest.raises(ValueError, match="empty"):
        LossNormalizer.merge([])


def test_aggregate_bad_input():
    norm = loss_normalizer(t(MASK), 10)
    with pytest.raises(ValueError, match="mode"):
        aggregate_token_values(t(VALUES), t(MASK), "seq-sum", norm)
    with pytest.raises(ValueError, match="mask"):
        aggregate_token_values(t(VALUES), t(MASK)[:2], "token-mean", norm)
    with pytest.raises(ValueError, match="t_norm"):
        loss_normalizer(t(MASK), 0)
    with pytest.raises(ValueError, match="loss_mask"):
        loss_normalizer(torch.ones(3), 1)


def test_masked_mean():
    assert masked_mean(t(VALUES), t(MASK)).item() == pytest.approx(3.6)
    assert masked_mean(t(VALUES), torch.zeros(3, 3)).item() == 0.0


# ---- vanilla PPO with clip-higher and dual clip -----------------------------------------------
# Five valid tokens (log-ratios chosen so that rho is exact) and one masked token.
#   tok  A   rho  l1=-A*rho  l2=-A*clip(rho,0.8,1.28)  max     dual(c=10, A<0)
#   1   +1  1.5    -1.5       -1.28                   -1.28   (PPO clip, high)
#   2   -1  0.5     0.5        0.8                     0.8    (PPO clip, low)
#   3   +2  1.1    -2.2       -2.2                    -2.2
#   4   -1  20     20          1.28                   20      min(20, 10) = 10 (dual clip)
#   5   +1  0.7    -0.7       -0.8                    -0.7
RHO = [1.5, 0.5, 1.1, 20.0, 0.7]
ADV = [[1.0, -1.0, 2.0, -1.0, 1.0, 3.0]]
NEW = [[LN(r) for r in RHO] + [-50.0]]
OLD = [[0.0] * 6]
MASK6 = [[1.0] * 5 + [0.0]]


def test_vanilla_with_dual_clip_hand():
    cfg = PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, dual_clip_c=10.0)
    loss, met, grad = run(NEW, OLD, ADV, MASK6, cfg)
    assert loss == pytest.approx((-1.28 + 0.8 - 2.2 + 10.0 - 0.7) / 5)  # 6.62 / 5 = 1.324
    assert met["pg_loss"] == pytest.approx(1.324)
    assert met["pg_clipfrac"] == pytest.approx(2 / 5)
    assert met["pg_clipfrac_high"] == pytest.approx(1 / 5)
    assert met["pg_clipfrac_low"] == pytest.approx(1 / 5)
    assert met["pg_clipfrac_dual"] == pytest.approx(1 / 5)
    assert met["cov_fraction"] == 0.0
    assert met["ratio_mean"] == pytest.approx(23.8 / 5)
    assert (met["ratio_max"], met["ratio_min"]) == (pytest.approx(20.0), pytest.approx(0.5))
    assert met["num_tokens"] == 5.0 and met["num_seqs"] == 1.0
    # d/dlogp of -A*rho is -A*rho; clipped and dual-clipped tokens have 0 gradient; /5 token-mean
    expected = torch.tensor([[0.0, 0.0, -2.2 / 5, 0.0, -0.7 / 5, 0.0]], dtype=D)
    torch.testing.assert_close(grad, expected)


def test_vanilla_without_dual_clip():
    cfg = PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28)
    loss, met, grad = run(NEW, OLD, ADV, MASK6, cfg)
    assert loss == pytest.approx((-1.28 + 0.8 - 2.2 + 20.0 - 0.7) / 5)  # 3.324
    assert met["pg_clipfrac_dual"] == 0.0
    assert grad[0, 3].item() == pytest.approx(-(-1.0) * 20.0 / 5)  # unclipped: +4


def test_ratio_clamped_at_20():
    # log-ratio 30 is clamped to 20: rho = e^20, gradient of the clamp is 0
    cfg = PolicyLossConfig()
    loss, met, grad = run([[30.0]], [[0.0]], [[-1.0]], [[1.0]], cfg)
    assert loss == pytest.approx(math.exp(20))
    assert met["ratio_max"] == pytest.approx(math.exp(20))
    assert grad[0, 0].item() == 0.0


def test_approx_kl_metric():
    # rho = 1.5: k3 = rho - 1 - log rho = 0.5 - 0.405465 = 0.094535
    _, met, _ = run([[LN(1.5)]], [[0.0]], [[1.0]], [[1.0]], PolicyLossConfig())
    assert met["approx_kl"] == pytest.approx(0.5 - LN(1.5))


def test_fully_masked_rows_and_padding_garbage():
    # row 1 fully masked with -inf / NaN garbage: loss and gradient stay finite and ignore it
    new = [[0.0, 0.0], [float("-inf"), float("-inf")]]
    old = [[0.0, 0.0], [float("nan"), 0.0]]
    adv = [[1.0, 2.0], [float("nan"), 5.0]]
    mask = [[1.0, 1.0], [0.0, 0.0]]
    for mode in AGG_MODES:
        cfg = PolicyLossConfig(loss_agg_mode=mode)
        loss, met, grad = run(new, old, adv, mask, cfg, t_norm=4.0)
        # token-mean -3/2; seq-mean-token-mean -1.5/1; seq-mean-token-sum -3/1; norm -3/(4*1)
        expected = {"token-mean": -1.5, "seq-mean-token-mean": -1.5, "seq-mean-token-sum": -3.0,
                    "seq-mean-token-sum-norm": -0.75}[mode]
        assert loss == pytest.approx(expected)
        assert torch.all(torch.isfinite(grad))
        assert torch.all(grad[1] == 0)
        assert met["num_seqs"] == 1.0


def test_everything_masked_gives_zero_and_zero_metrics():
    loss, met, grad = run([[0.1, 0.2]], [[0.0, 0.0]], [[1.0, 1.0]], [[0.0, 0.0]], PolicyLossConfig())
    assert loss == 0.0 and torch.all(grad == 0)
    assert met["ratio_mean"] == 0.0 and met["pg_clipfrac"] == 0.0 and met["num_tokens"] == 0.0


def test_seq_mean_token_sum_norm_hand():
    # two sequences: S_0 = -(1*1 + 1*1) = -2 (rho 1), S_1 = -(2*1) = -2 -> (-4)/(T=8 * 2) = -0.25
    cfg = PolicyLossConfig(loss_agg_mode="seq-mean-token-sum-norm")
    loss, _, grad = run([[0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]], [[1.0, 1.0], [2.0, 0.0]],
                        [[1.0, 1.0], [1.0, 0.0]], cfg, t_norm=8.0)
    assert loss == pytest.approx(-0.25)
    torch.testing.assert_close(grad, torch.tensor([[-1 / 16, -1 / 16], [-2 / 16, 0.0]], dtype=D))


# ---- Clip-Cov ----------------------------------------------------------------------------------
# A = [3, -1, -1, -1] (mean 0); logp_new = [-1, -3, -3, -3] (mean -2.5); rho = 1 everywhere.
# cov = (A - 0) * (logp - (-2.5)) = [3*1.5, -1*-0.5, ..] = [4.5, 0.5, 0.5, 0.5]
# With lb=1, ub=5 the only candidate is token 0; k = max(floor(2e-4 * 4), 1) = 1 -> it is zeroed.
CC_NEW = [[-1.0, -3.0, -3.0, -3.0]]
CC_ADV = [[3.0, -1.0, -1.0, -1.0]]
ONES4 = [[1.0] * 4]


def test_clip_cov_hand():
    cfg = PolicyLossConfig(loss_mode="clip_cov")
    loss, met, grad = run(CC_NEW, CC_NEW, CC_ADV, ONES4, cfg, generator=make_generator(0))
    # token losses -A*rho = [-3, 1, 1, 1]; token 0 multiplied by 0 -> (0+1+1+1)/4 (still /4)
    assert loss == pytest.approx(0.75)
    assert met["cov_fraction"] == pytest.approx(0.25)
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.25, 0.25, 0.25]], dtype=D))
    # vanilla on the same data: (-3+1+1+1)/4 = 0 and token 0 has gradient -3/4
    loss_v, _, grad_v = run(CC_NEW, CC_NEW, CC_ADV, ONES4, PolicyLossConfig())
    assert loss_v == pytest.approx(0.0) and grad_v[0, 0].item() == pytest.approx(-0.75)


@pytest.mark.parametrize("lb, ub", [(1.0, 4.5), (4.5, 5.0)])
def test_clip_cov_bounds_are_strict(lb, ub):
    cfg = PolicyLossConfig(loss_mode="clip_cov", clip_cov_lb=lb, clip_cov_ub=ub)
    loss, met, _ = run(CC_NEW, CC_NEW, CC_ADV, ONES4, cfg, generator=make_generator(0))
    assert met["cov_fraction"] == 0.0 and loss == pytest.approx(0.0)


def test_clip_cov_skips_ppo_clipped_tokens():
    # token 0 gets rho = 1.5 (A=+3 > 0 -> clipped at 1.2): not a candidate although cov = 4.5
    old = [[-1.0 - LN(1.5), -3.0, -3.0, -3.0]]
    cfg = PolicyLossConfig(loss_mode="clip_cov")
    loss, met, _ = run(CC_NEW, old, CC_ADV, ONES4, cfg, generator=make_generator(0))
    assert met["cov_fraction"] == 0.0
    assert met["pg_clipfrac"] == pytest.approx(0.25)
    assert loss == pytest.approx((-3 * 1.2 + 3.0) / 4)  # -0.15


def test_clip_cov_k1_random_choice_among_candidates():
    # A = [2, 2, -2, -2] (mean 0), logp = [0, 0, -2, -2] (mean -1): cov = 2 for all 4 -> 4 candidates,
    # k = max(floor(2e-4*4), 1) = 1: exactly one token zeroed, chosen uniformly at random.
    new, adv = [[0.0, 0.0, -2.0, -2.0]], [[2.0, 2.0, -2.0, -2.0]]
    cfg = PolicyLossConfig(loss_mode="clip_cov")
    chosen = set()
    for seed in range(40):
        loss, met, grad = run(new, new, adv, ONES4, cfg, generator=make_generator(seed))
        assert met["cov_fraction"] == pytest.approx(0.25)
        zero = [i for i in range(4) if grad[0, i].item() == 0.0]
        assert len(zero) == 1
        chosen.add(zero[0])
        # token losses [-2,-2,2,2]: zeroing a positive-A token gives +2/4, a negative-A one -2/4
        assert loss == pytest.approx(0.5 if zero[0] < 2 else -0.5)
    assert chosen == {0, 1, 2, 3}
    # same seed, same choice
    _, _, g1 = run(new, new, adv, ONES4, cfg, generator=make_generator(7))
    _, _, g2 = run(new, new, adv, ONES4, cfg, generator=make_generator(7))
    assert torch.equal(g1, g2)


def test_clip_cov_ratio_sets_k():
    # r = 0.5 over 4 valid tokens: k = floor(2) = 2 of the 4 candidates
    new, adv = [[0.0, 0.0, -2.0, -2.0]], [[2.0, 2.0, -2.0, -2.0]]
    cfg = PolicyLossConfig(loss_mode="clip_cov", clip_cov_ratio=0.5)
    _, met, _ = run(new, new, adv, ONES4, cfg, generator=make_generator(1))
    assert met["cov_fraction"] == pytest.approx(0.5)


def test_clip_cov_has_no_dual_clip():
    # A=-1, rho=20: vanilla with c=10 gives 10; clip_cov (as released) gives 20
    cfg = PolicyLossConfig(loss_mode="clip_cov", dual_clip_c=10.0)
    loss, met, _ = run([[LN(20.0)]], [[0.0]], [[-1.0]], [[1.0]], cfg, generator=make_generator(0))
    assert loss == pytest.approx(20.0) and met["pg_clipfrac_dual"] == 0.0
    loss_v, _, _ = run([[LN(20.0)]], [[0.0]], [[-1.0]], [[1.0]], cfg.replace(loss_mode="vanilla"))
    assert loss_v == pytest.approx(10.0)


# ---- KL-Cov ------------------------------------------------------------------------------------
def test_kl_cov_hand():
    # cov as in the Clip-Cov case: [4.5, 0.5, 0.5, 0.5]; k = max(1, floor(2e-4*4)) = 1 -> token 0.
    # token 0 has rho = 1.5 (unclipped in kl_cov): l = -3*1.5 + 0.1*|ln 1.5| = -4.5 + 0.040547
    # other tokens: -A*rho = 1 each -> loss = (-4.459453 + 3)/4
    old = [[-1.0 - LN(1.5), -3.0, -3.0, -3.0]]
    cfg = PolicyLossConfig(loss_mode="kl_cov")
    loss, met, grad = run(CC_NEW, old, CC_ADV, ONES4, cfg)
    assert loss == pytest.approx((-4.5 + 0.1 * LN(1.5) + 3.0) / 4)
    assert met["cov_fraction"] == pytest.approx(0.25)
    assert met["pg_clipfrac"] == 0.0
    # d/dlogp: token 0: -A*rho + 0.1*sign = -4.5 + 0.1 = -4.4 -> /4; others -A*rho/4 = 0.25
    torch.testing.assert_close(grad, torch.tensor([[-4.4 / 4, 0.25, 0.25, 0.25]], dtype=D))


def test_kl_cov_ties_take_lowest_index():
    # all cov equal (2.0): top-1 must be token 0; loss there gets + 0.1*|0| = 0 extra, so check via
    # a log-ratio on every token (rho = e^0.1)
    new, adv = [[0.0, 0.0, -2.0, -2.0]], [[2.0, 2.0, -2.0, -2.0]]
    old = [[-0.1, -0.1, -2.1, -2.1]]
    cfg = PolicyLossConfig(loss_mode="kl_cov", kl_cov_coef=1.0)
    _, _, grad = run(new, old, adv, ONES4, cfg)
    rho = math.exp(0.1)
    # token 0 (chosen): d/dlogp = -A*rho + 1*sign(0.1) = -2 rho + 1; others -A*rho; all /4
    expected = [[(-2 * rho + 1) / 4, -2 * rho / 4, 2 * rho / 4, 2 * rho / 4]]
    torch.testing.assert_close(grad, torch.tensor(expected, dtype=D))


# ---- truncated importance sampling (docs/algorithms.md 1.6) ------------------------------------------------
def test_tis_weight_and_mismatch_metrics():
    # rho = 1 (new = old = 0), A = 1. engine logp: old - engine = ln 3 -> w = min(3, 2) = 2;
    # old - engine = ln 0.5 -> w = 0.5. Loss = (-1*2 + -1*0.5)/2 = -1.25
    engine = t([[-LN(3.0), LN(2.0)]])
    cfg = PolicyLossConfig(tis_cap=2.0)
    loss, met, grad = run([[0.0, 0.0]], [[0.0, 0.0]], [[1.0, 1.0]], [[1.0, 1.0]], cfg, engine_logp=engine)
    assert loss == pytest.approx(-1.25)
    assert met["tis_weight_mean"] == pytest.approx(1.25)
    assert met["tis_clipfrac"] == pytest.approx(0.5)
    assert met["logp_mismatch_mean"] == pytest.approx((LN(3) + LN(2)) / 2)
    assert met["logp_mismatch_max"] == pytest.approx(LN(3))
    # weight is detached: gradient = -A*rho*w/2
    torch.testing.assert_close(grad, torch.tensor([[-1.0, -0.25]], dtype=D))
    # tis_cap None: no weighting, but the mismatch is still reported
    loss0, met0, _ = run([[0.0, 0.0]], [[0.0, 0.0]], [[1.0, 1.0]], [[1.0, 1.0]], PolicyLossConfig(),
                         engine_logp=engine)
    assert loss0 == pytest.approx(-1.0)
    assert "tis_weight_mean" not in met0
    assert met0["logp_mismatch_max"] == pytest.approx(LN(3))


# ---- KL to reference and entropy bonus --------------------------------------------------------
def test_kl_penalty_estimators():
    new, ref = t([[0.0, 0.0]]), t([[LN(2.0), 0.0]])
    torch.testing.assert_close(kl_penalty(new, ref, "k1"), t([[-LN(2.0), 0.0]]))
    # k3: exp(ref-new) - (ref-new) - 1 = 2 - ln 2 - 1 = 0.306853
    torch.testing.assert_close(kl_penalty(new, ref, "k3"), t([[1.0 - LN(2.0), 0.0]]))
    # clamps: ref-new = 30 -> clamp 20 -> e^20 - 21 -> clamp 10
    assert kl_penalty(t([[0.0]]), t([[30.0]]), "k3").item() == 10.0
    with pytest.raises(ValueError, match="estimator"):
        kl_penalty(new, ref, "k2")


def test_kl_ref_term_in_loss():
    # A = 0 so the PG term is 0; kl_coef 0.5 * token-mean(k3) = 0.5 * 0.306853 / 2
    ref = t([[LN(2.0), 0.0]])
    cfg = PolicyLossConfig(kl_coef=0.5, kl_estimator="k3")
    loss, met, grad = run([[0.0, 0.0]], [[0.0, 0.0]], [[0.0, 0.0]], [[1.0, 1.0]], cfg, ref_logp=ref)
    assert loss == pytest.approx(0.5 * (1 - LN(2)) / 2)
    assert met["kl_ref"] == pytest.approx((1 - LN(2)) / 2)
    # d k3 / d new = 1 - exp(ref - new) = 1 - 2 = -1 -> 0.5 * -1 / 2
    torch.testing.assert_close(grad, t([[-0.25, 0.0]]))
    cfg1 = PolicyLossConfig(kl_coef=0.5, kl_estimator="k1")
    loss1, _, grad1 = run([[0.0, 0.0]], [[0.0, 0.0]], [[0.0, 0.0]], [[1.0, 1.0]], cfg1, ref_logp=ref)
    assert loss1 == pytest.approx(0.5 * (-LN(2)) / 2)
    torch.testing.assert_close(grad1, t([[0.25, 0.25]]))


def test_entropy_bonus():
    ent = t([[1.0, 3.0]]).requires_grad_(True)
    m = t([[1.0, 1.0]])
    cfg = PolicyLossConfig(entropy_coef=0.1)
    lp = t([[0.0, 0.0]]).requires_grad_(True)
    loss, met = policy_loss(lp, t([[0.0, 0.0]]), t([[0.0, 0.0]]), m, config=cfg,
                            normalizer=loss_normalizer(m, 1.0), entropy=ent)
    assert loss.item() == pytest.approx(-0.1 * 2.0)  # -0.1 * mean(1, 3)
    assert met["entropy"] == pytest.approx(2.0)
    loss.backward()
    torch.testing.assert_close(ent.grad, t([[-0.05, -0.05]]))


# ---- validation --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field, value",
    [
        ("clip_ratio_low", -0.1),
        ("clip_ratio_high", -0.2),
        ("dual_clip_c", 1.0),
        ("loss_mode", "clip-cov"),
        ("loss_agg_mode", "mean"),
        ("clip_cov_ratio", 0.0),
        ("clip_cov_ub", 0.5),
        ("kl_cov_ratio", 2.0),
        ("kl_cov_coef", -1.0),
        ("tis_cap", 0.0),
        ("kl_coef", -0.001),
        ("kl_estimator", "k2"),
        ("entropy_coef", float("nan")),
    ],
)
def test_config_validation_names_field(field, value):
    cfg = PolicyLossConfig(**{field: value})
    with pytest.raises(ValueError, match=field):
        cfg.validate()
    m = t([[1.0]])
    with pytest.raises(ValueError, match=f"policy_loss: `{field}`"):
        policy_loss(t([[0.0]]), t([[0.0]]), t([[1.0]]), m, config=cfg, normalizer=loss_normalizer(m, 1))


def test_policy_loss_bad_input():
    m = t([[1.0, 1.0]])
    norm = loss_normalizer(m, 1)
    cfg = PolicyLossConfig()
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(t([[0.0, 0.0]]), t([[0.0, 0.0]]), t([[1.0]]), m, config=cfg, normalizer=norm)
    with pytest.raises(ValueError, match="logp_new"):
        policy_loss(t([0.0, 0.0]), t([[0.0, 0.0]]), t([[1.0, 1.0]]), m, config=cfg, normalizer=norm)
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(t([[0.0, 0.0]]), t([[0.0, 0.0]]), t([[1.0, 1.0]]), m,
                    config=PolicyLossConfig(kl_coef=0.1), normalizer=norm)
    with pytest.raises(ValueError, match="entropy"):
        policy_loss(t([[0.0, 0.0]]), t([[0.0, 0.0]]), t([[1.0, 1.0]]), m,
                    config=PolicyLossConfig(entropy_coef=0.1), normalizer=norm)
    with pytest.raises(ValueError, match="engine_logp"):
        policy_loss(t([[0.0, 0.0]]), t([[0.0, 0.0]]), t([[1.0, 1.0]]), m, config=cfg, normalizer=norm,
                    engine_logp=t([[0.0]]))
    # a normalizer smaller than this call's own mask cannot be the global one
    with pytest.raises(ValueError, match="normalizer"):
        policy_loss(t([[0.0, 0.0]]), t([[0.0, 0.0]]), t([[1.0, 1.0]]), m, config=cfg,
                    normalizer=LossNormalizer(1.0, 1.0, 1.0))
