"""Policy-loss and aggregation modes are registries: custom modes are selected by name."""
import pytest
import torch

from rllib_spear.core.losses import (
    AGG_MODES,
    LOSS_AGGS,
    LOSS_MODES,
    POLICY_LOSSES,
    PolicyLossConfig,
    TokenLoss,
    aggregate_token_values,
    get_loss_agg,
    get_policy_loss,
    loss_normalizer,
    policy_loss,
    register_loss_agg,
    register_policy_loss,
)

D = torch.float64


@pytest.fixture
def reinforce_mode():
    @register_policy_loss("test_reinforce")
    def reinforce(terms, config):
        return TokenLoss(-terms.advantages * terms.logp)

    yield "test_reinforce"
    POLICY_LOSSES.unregister("test_reinforce")


@pytest.fixture
def row_sum_agg():
    register_loss_agg("test-token-sum", lambda row_sum, mask, norm: (row_sum.sum(), 1.0))
    yield "test-token-sum"
    LOSS_AGGS.unregister("test-token-sum")


def test_builtins_are_registered():
    assert set(LOSS_MODES) <= set(POLICY_LOSSES.names())
    assert set(AGG_MODES) <= set(LOSS_AGGS.names())
    assert get_policy_loss("clip_cov") is POLICY_LOSSES.get("clip_cov")
    assert get_loss_agg("token-mean") is LOSS_AGGS.get("token-mean")
    with pytest.raises(ValueError, match="register_policy_loss"):
        get_policy_loss("nope")


def test_custom_loss_mode_selected_by_name(reinforce_mode):
    # REINFORCE: l = -A * logp. logp = [-1, -2 | -3, garbage], A = [2, -1 | 0.5, 9], mask [1 1 | 1 0]
    # token-mean over N_tok = 3: (2*1 - 1*2 + 0.5*3) / 3 = 0.5; d loss / d logp = -A / 3 on valid tokens.
    lp = torch.tensor([[-1.0, -2.0], [-3.0, float("-inf")]], dtype=D, requires_grad=True)
    adv = torch.tensor([[2.0, -1.0], [0.5, 9.0]], dtype=D)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=D)
    cfg = PolicyLossConfig(loss_mode=reinforce_mode)
    loss, met = policy_loss(lp, lp.detach() - 0.3, adv, mask, config=cfg, normalizer=loss_normalizer(mask, 1.0))
    loss.backward()
    assert loss.item() == pytest.approx(0.5)
    torch.testing.assert_close(lp.grad, torch.tensor([[-2 / 3, 1 / 3], [-0.5 / 3, 0.0]], dtype=D))
    # the shared pieces still run around it; a mode without a clip reports no clipped tokens
    assert met["pg_loss"] == pytest.approx(0.5) and met["pg_clipfrac"] == 0.0 and met["cov_fraction"] == 0.0
    assert met["ratio_mean"] == pytest.approx(torch.exp(torch.tensor(0.3)).item())


def test_custom_loss_mode_gets_tis_weight_and_aggregation(reinforce_mode, row_sum_agg):
    lp = torch.tensor([[-1.0, -2.0]], dtype=D, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0]], dtype=D)
    mask = torch.ones(1, 2, dtype=D)
    # w = min(exp(old - engine), 2) = [2 (capped), 1]; sum aggregation: 2*1 + 1*2 = 4
    cfg = PolicyLossConfig(loss_mode=reinforce_mode, loss_agg_mode=row_sum_agg, tis_cap=2.0)
    old = torch.tensor([[-1.0, -2.0]], dtype=D)
    loss, met = policy_loss(lp, old, adv, mask, config=cfg, normalizer=loss_normalizer(mask, 1.0),
                            engine_logp=old - torch.tensor([[3.0, 0.0]], dtype=D))
    assert loss.item() == pytest.approx(4.0)
    assert met["tis_clipfrac"] == pytest.approx(0.5)


def test_custom_agg_mode(row_sum_agg):
    v = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=D)
    m = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=D)
    assert aggregate_token_values(v, m, row_sum_agg, loss_normalizer(m, 1.0)).item() == pytest.approx(8.0)


def test_unknown_loss_mode_names_field_and_choices():
    with pytest.raises(ValueError, match="`loss_mode`") as e:
        PolicyLossConfig(loss_mode="reinforce_nope").validate()
    msg = str(e.value)
    assert "reinforce_nope" in msg and all(name in msg for name in LOSS_MODES)
    assert "register_policy_loss" in msg


def test_unknown_agg_mode_names_field_and_choices(row_sum_agg):
    with pytest.raises(ValueError, match="`loss_agg_mode`") as e:
        PolicyLossConfig(loss_agg_mode="token-sum").validate()
    msg = str(e.value)
    assert all(name in msg for name in AGG_MODES) and row_sum_agg in msg
    assert "register_loss_agg" in msg
    with pytest.raises(ValueError, match="mode must be one of"):
        aggregate_token_values(torch.ones(1, 1), torch.ones(1, 1), "token-sum", loss_normalizer(torch.ones(1, 1), 1.0))


def test_registered_mode_is_valid_then_invalid_after_unregister(reinforce_mode):
    PolicyLossConfig(loss_mode=reinforce_mode).validate()
    POLICY_LOSSES.unregister(reinforce_mode)
    try:
        with pytest.raises(ValueError, match="loss_mode"):
            PolicyLossConfig(loss_mode=reinforce_mode).validate()
    finally:
        register_policy_loss(reinforce_mode, lambda terms, config: TokenLoss(terms.loss_unclipped))


def test_builtin_name_cannot_be_taken():
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("vanilla", lambda terms, config: TokenLoss(terms.loss_unclipped))
    with pytest.raises(ValueError, match="already registered"):
        register_loss_agg("token-mean", lambda row_sum, mask, norm: (row_sum.sum(), 1.0))
