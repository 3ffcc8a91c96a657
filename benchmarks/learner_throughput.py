"""Trained tokens/s of the GRPOTorchLearner update vs a bare torch loop on the same tokens.

Both sides: the tiny model (``rllib_spear.models.factory.tiny_model_path()``), the same batch of
~32 synthetic trajectories of ~200 tokens, the same token-budget micro-batches
(``algorithms.grpo.microbatching``), the same log-probs (``models.logprobs.token_logprobs``) and
Dr.BoT loss (``core.losses.policy_loss``), one AdamW step with global-norm clipping per update. The
bare side calls those library functions in a plain torch loop; the learner side goes through
RLlib's ``Learner.update`` (batch conversion, metrics logging, gradient clipping, metrics
reduction), so the ratio is the cost of the learner machinery around the same math.

    python benchmarks/learner_throughput.py [--trajs 32] [--tokens 200] [--budget 2048] [--iters 5]
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import numpy as np
import torch


def synthetic_trajectories(n, length, vocab, seed=0, group_size=8):
    from rllib_spear.core.trajectory import Segment, Trajectory
    from rllib_spear.testing import make_stats

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        L = int(length + rng.integers(-length // 10, length // 10 + 1))
        p, a1, o = L // 4, (L * 3) // 10, L // 6
        a2 = L - p - a1 - o
        tok = lambda k: rng.integers(3, vocab, k).tolist()  # noqa: E731
        lp = lambda k: (-rng.random(k) * 3).tolist()  # noqa: E731
        segs = [Segment("prompt", tok(p)), Segment("assistant", tok(a1), lp(a1), 0),
                Segment("observation", tok(o)), Segment("assistant", tok(a2), lp(a2), 1)]
        outcome = float(rng.choice([0.0, 1.0]))
        out.append(Trajectory(uid=f"task{i // group_size}", segments=segs, outcome_reward=outcome,
                              stats=make_stats(success=outcome > 0, outcome_reward=outcome, tool_calls=1,
                                               queries_per_step=[1, 0])))
    return out


def learner_batch(trajs, t_norm):
    from rllib_spear.recipe.batching import LearnerRow, build_learner_batches
    from rllib_spear.core.advantages import group_advantages

    adv = group_advantages(np.array([t.total_reward for t in trajs]), [t.uid for t in trajs],
                           std_normalize=False)
    rows = [LearnerRow(t, t.token_advantages(float(a)), t.loss_mask()) for t, a in zip(trajs, adv)]
    return build_learner_batches(rows, num_learners=0, minibatch_size=None, t_norm=t_norm,
                                 pad_token_id=0)[0]


def bench_learner(cfg, batch, iters):
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

    learner = cfg.build_learner(env=None)
    tokens = int(batch["attention_mask"].sum())
    times = []
    for i in range(iters + 1):
        mab = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(dict(batch))}, env_steps=len(batch["input_ids"]))
        t0 = time.perf_counter()
        learner.update(batch=mab, timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: i + 1})
        times.append(time.perf_counter() - t0)
    return tokens, times[1:], learner


def bench_bare(model, batch, cfg, iters):
    from rllib_spear.algorithms.grpo.microbatching import slice_rows, token_budget_microbatches
    from rllib_spear.core.losses import LossNormalizer, policy_loss
    from rllib_spear.models.logprobs import token_logprobs

    data = {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()}
    parts = token_budget_microbatches(data["attention_mask"], int(cfg.micro_batch_token_budget))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.adam_betas), weight_decay=cfg.weight_decay)
    loss_cfg = cfg.policy_loss_config()
    # the global normalizers the driver wrote on every row (one mini-batch, no replay rows)
    norm = LossNormalizer(float(data["norm_num_tokens"][0]), float(data["norm_num_seqs"][0]),
                          float(data["t_norm"][0]))
    tokens = int(data["attention_mask"].sum())
    model.train()
    times = []
    for _ in range(iters + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for part in parts:
            sub = slice_rows(data, part)
            lp = token_logprobs(model, sub["input_ids"].long(), sub["attention_mask"].long(),
                                temperature=float(cfg.temperature))
            loss, _ = policy_loss(lp, sub["old_logp"].float(), sub["advantages"].float(),
                                  sub["loss_mask"].float(), config=loss_cfg, normalizer=norm)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    return tokens, times[1:], len(parts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trajs", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--budget", type=int, default=2048, help="micro_batch_token_budget")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    import rllib_spear  # noqa: F401
    from rllib_spear import SPEARConfig
    from rllib_spear.models.factory import tiny_model_path
    from transformers import AutoModelForCausalLM

    path = tiny_model_path()
    cfg = (SPEARConfig().environment("search_qa")
           .env_runners(num_env_runners=0, max_response_tokens=256, max_model_len=512)
           .training(lr=1e-5, loss_mode="vanilla", entropy_coeff=0.0,
                     micro_batch_token_budget=args.budget)
           .rl_module(model_config={"model_path": path}).debugging(seed=0))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    trajs = synthetic_trajectories(args.trajs, args.tokens, model.config.vocab_size)
    batch = learner_batch(trajs, cfg.loss_t_norm)

    tok_b, t_bare, n_parts = bench_bare(model, batch, cfg, args.iters)
    tok_l, t_learn, _ = bench_learner(cfg, batch, args.iters)
    # bare again, so that a warm-up / frequency drift does not favour one side
    _, t_bare2, _ = bench_bare(model, batch, cfg, args.iters)
    t_bare = t_bare + t_bare2
    bare = tok_b / float(np.median(t_bare))
    learn = tok_l / float(np.median(t_learn))
    print(f"batch: {args.trajs} trajectories, {tok_l} tokens, {n_parts} micro-batches "
          f"(budget {args.budget}), torch threads {torch.get_num_threads()}")
    print(f"bare torch loop   : {bare:10.1f} tokens/s  (median {np.median(t_bare) * 1e3:.1f} ms/update)")
    print(f"GRPOTorchLearner  : {learn:10.1f} tokens/s  (median {np.median(t_learn) * 1e3:.1f} ms/update)")
    ratio = learn / bare
    print(f"ratio learner/bare: {ratio:.3f}x  (target >= 0.9x: {'OK' if ratio >= 0.9 else 'BELOW'})")


if __name__ == "__main__":
    main()
