"""One SPEAR iteration (SIL off, no tool reward, vanilla loss) equals a hand-rolled Dr.BoT update.

The hand-rolled update uses nothing of rllib_spear but the sampled trajectories: Dr.GRPO
advantages (R_i - group mean), a plain full-logits forward, the PPO clip-higher / dual-clip token
loss, the seq-mean-token-sum-norm aggregation, AdamW and global-norm clipping in plain torch.
"""
from __future__ import annotations

import copy
from collections import defaultdict

import numpy as np
import pytest
import torch

import rllib_spear  # noqa: F401  (registers the algorithms)
from rllib_spear import SPEARConfig

from e2e_helpers import recorder, small_config, with_trajectory_hook


def _hand_rolled_drbot_step(model, trajs, *, lr, t_norm, clip_low=0.2, clip_high=0.28,
                            dual_c=10.0, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8,
                            max_grad_norm=1.0, std_normalize=False):
    """One Dr.BoT optimizer step of `model` on `trajs` (whole batch, one mini-batch)."""
    # Dr.GRPO advantage: R_i - mean of its uid group (no std normalisation).
    by_uid = defaultdict(list)
    for t in trajs:
        by_uid[t.uid].append(t.total_reward)
    means = {u: float(np.mean(v)) for u, v in by_uid.items()}
    stds = {u: float(np.std(v, ddof=1)) + 1e-6 for u, v in by_uid.items()}

    masks = [torch.from_numpy(t.loss_mask()).double() for t in trajs]
    n_seq = sum(1 for m in masks if m.sum() > 0)
    assert n_seq > 0
    denom = float(t_norm) * float(n_seq)

    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    opt.zero_grad(set_to_none=True)
    for t, m in zip(trajs, masks):
        ids = torch.from_numpy(t.input_ids()).long()[None]
        adv_scalar = float(t.total_reward) - means[t.uid]
        if std_normalize:  # GRPO, not Dr.BoT: only used to show that the comparison can fail
            adv_scalar /= stds[t.uid]
        adv = torch.from_numpy(t.loss_mask()).float() * adv_scalar
        old = torch.from_numpy(t.behaviour_logprobs()).float()
        logits = model(input_ids=ids).logits.float()[0, :-1]  # position t predicts token t+1
        lp_next = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        logp = torch.cat([lp_next.new_zeros(1), lp_next])  # logp[t] = log p(x_t | x_<t)
        ratio = torch.exp((logp - old).clamp(-20.0, 20.0))
        l1 = -adv * ratio
        l2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
        tok = torch.maximum(l1, l2)
        if dual_c is not None:
            tok = torch.where(adv < 0, torch.minimum(tok, -adv * dual_c), tok)
        mf = m.float()
        loss = (torch.where(mf > 0, tok, torch.zeros_like(tok)) * mf).sum() / denom
        loss.backward()
    torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    opt.step()
    return model


def _max_param_diff(a: dict, b: dict) -> tuple[float, str]:
    worst, name = 0.0, ""
    for k, v in a.items():
        d = float((v.float() - b[k].float()).abs().max())
        if d > worst:
            worst, name = d, k
    return worst, name


def test_one_iteration_equals_hand_rolled_drbot(ray_session, tiny_model):
    cfg = (small_config(SPEARConfig, tiny_model, sil_enabled=False, tool_reward_schedule="none",
                        loss_mode="vanilla", response_filters=(), group_filter_keep_fraction=None,
                        entropy_coeff=0.0)
           .env_runners(num_env_runners=0))
    # An untrained tiny model rarely earns a reward, and all-equal rewards give zero advantages
    # (only weight decay would move the weights): the hook gives the sampled trajectories seeded
    # synthetic outcome rewards so that the policy gradient is real.
    hook, captured = recorder(synthetic_rewards=True)
    cfg = with_trajectory_hook(cfg, hook)
    assert cfg.clip_ratio_low == 0.2 and cfg.clip_ratio_high == 0.28 and cfg.dual_clip_c == 10.0
    assert cfg.loss_agg_mode == "seq-mean-token-sum-norm" and not cfg.std_normalize_advantages
    algo = cfg.build_algo()
    try:
        learner = algo.learner_group._learner
        hf = learner.module["default_policy"].model
        init_state = copy.deepcopy(hf.state_dict())

        algo.train()
        assert len(captured) == 1
        trajs = captured[0][0]
        assert trajs, "the iteration sampled nothing"
        assert any(t.loss_mask().sum() > 0 for t in trajs)
        after = {k: v.detach().clone() for k, v in hf.state_dict().items()}
        # the algorithm really moved the weights
        moved, _ = _max_param_diff(init_state, after)
        assert moved > 1e-6

        def hand(**kw):
            model = copy.deepcopy(hf)
            model.load_state_dict(init_state)
            _hand_rolled_drbot_step(model, trajs, lr=cfg.lr, t_norm=cfg.max_response_tokens, **kw)
            return model.state_dict()

        ref = hand()
        diff, where = _max_param_diff(ref, after)
        assert diff < 1e-5, f"max |param diff| {diff:g} at {where}"

        # The comparison can fail: another advantage (GRPO's std normalisation, which reweights
        # the groups) gives other parameters. (A wrong global normalizer alone would not show:
        # Adam is invariant to a constant scale of the loss.)
        wrong_adv = hand(std_normalize=True)
        wrong_diff = _max_param_diff(wrong_adv, after)[0]
        print(f"\n{len(trajs)} trajectories; max |param diff| learner vs hand-rolled {diff:.3g}, "
              f"vs GRPO-advantage variant {wrong_diff:.3g}, step size {moved:.3g}")
        assert wrong_diff > 10 * max(diff, 1e-7)
        no_step = _max_param_diff(init_state, after)[0]
        assert no_step > 10 * max(diff, 1e-7)
    finally:
        algo.stop()
