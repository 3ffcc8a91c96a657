"""Trained tokens/s of the GRPOTorchLearner update, run as ``GRPO.training_step`` runs it, vs a
bare torch loop on the same tokens.

Learner side, as ``GRPO.update_learners`` calls it: the algorithm's config defaults
(``--algo grpo``: entropy_coeff 0, so the entropy metric is on through its token sample; ``spear``:
Clip-Cov and the entropy bonus; micro_batch_token_budget 8192 unless ``--budget``), the batch
built by ``recipe.batching.build_learner_batches`` with the config's learner count, mini-batch
size, T_norm and pad id, and ``LearnerGroup.update`` on a local learner (batch conversion,
metrics logging and reduction, grad_norm, clipping, the optimizer the learner builds).

Bare side (the reference): per token-budget micro-batch a plain HF body forward, the output head
and log-softmax gather on the completion (loss-mask) positions only, ``core.losses.policy_loss``
with the same global normalizers, backward; then global-norm clipping and one fused AdamW step.

Both sides: the tiny model (``rllib_spear.models.factory.tiny_model_path()``, sizes by flag), ~32
synthetic trajectories of ~200 tokens (prompt | assistant | observation | assistant; lengths
spread by +-``--spread`` of ``--tokens``). The bare side runs before and after the learner
(frequency drift does not favour one side).

``--packed``: the learner also runs with ``learners(packed_microbatches=True)`` (the body over the
real tokens of each micro-batch packed into one row, docs/design.md "Packed micro-batches") on the
same batches, and the trained (real) tokens/s of both are printed, with the padded tokens the
micro-batches carry. A ragged batch shows the difference: ``--spread 0.9``.

    python benchmarks/learner_throughput.py [--algo grpo] [--trajs 32] [--tokens 200] [--budget 0]
        [--iters 5] [--hidden 128 --layers 2 --vocab 512] [--spread 0.1] [--packed]
        [--mixed-precision bf16,auto]

``--mixed-precision``: the learner also runs with each ``learners(mixed_precision=...)`` value
(bf16 compute over float32 master weights; ``auto``: bf16 on a CPU with bf16 instructions, else
float32) on the same batches, and its tokens/s over the float32 learner's is printed.
"""
from __future__ import annotations

import argparse
import math
import os
import time
from fractions import Fraction

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import numpy as np
import torch


def synthetic_trajectories(n, length, vocab, seed=0, group_size=8, spread=0.1):
    from rllib_spear.core.trajectory import Segment, Trajectory
    from rllib_spear.testing import make_stats

    rng = np.random.default_rng(seed)
    frac = Fraction(str(spread))  # exact: spread 0.1 draws what length // 10 always drew
    out = []
    for i in range(n):
        L = int(length + rng.integers(-math.ceil(length * frac), math.floor(length * frac) + 1))
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


def learner_rows(trajs):
    """Dr.BoT / GRPO rows: group-mean advantages, no std normalisation."""
    from rllib_spear.core.advantages import group_advantages
    from rllib_spear.recipe.batching import LearnerRow

    adv = group_advantages(np.array([t.total_reward for t in trajs]), [t.uid for t in trajs],
                           std_normalize=False)
    return [LearnerRow(t, t.token_advantages(float(a)), t.loss_mask()) for t, a in zip(trajs, adv)]


def learner_batch(rows, cfg, seed=0):
    """The batch ``GRPO.update_learners`` builds (one learner)."""
    from rllib_spear.recipe.batching import build_learner_batches

    return build_learner_batches(rows, num_learners=cfg.num_learners, minibatch_size=cfg.minibatch_size,
                                 t_norm=cfg.loss_t_norm, pad_token_id=0, seed=seed)[0]


def bench_learner(cfg, rows, iters):
    """``GRPO.update_learners`` on a local LearnerGroup: (tokens per update, update times)."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME
    from rllib_spear.recipe.batching import build_learner_batches

    group = cfg.build_learner_group(env=None)
    times, tokens = [], 0
    for i in range(iters + 1):
        batch = build_learner_batches(rows, num_learners=cfg.num_learners, minibatch_size=cfg.minibatch_size,
                                      t_norm=cfg.loss_t_norm, pad_token_id=0, seed=i)[0]
        tokens = int(batch["attention_mask"].sum())
        mab = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(batch)}, env_steps=len(batch["input_ids"]))
        t0 = time.perf_counter()
        res = group.update(batch=mab, timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: i + 1})
        times.append(time.perf_counter() - t0)
    res = res[0] if isinstance(res, list) else res
    metrics = sorted(res[DEFAULT_MODULE_ID]) if DEFAULT_MODULE_ID in res else []
    return tokens, times[1:], metrics


def padded_tokens(batch, budget: int) -> int:
    """Tokens the padded micro-batches of ``batch`` carry (rows x longest row, summed)."""
    from rllib_spear.learner.microbatching import token_budget_microbatches

    lengths = np.asarray(batch["attention_mask"]).sum(1)
    parts = token_budget_microbatches(torch.as_tensor(np.asarray(batch["attention_mask"])), int(budget))
    return int(sum(len(p) * lengths[p.numpy()].max() for p in parts))


def bare_logprobs(model, ids, attn, score, temperature):
    """Plain torch: HF body, then head + log-softmax + gather on the ``score`` positions only."""
    from rllib_spear.models.logprobs import position_ids_from_mask

    hidden = model.model(input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn),
                         use_cache=False).last_hidden_state
    sel = score[:, 1:]
    logits = model.lm_head(hidden[:, :-1][sel]).float() / temperature
    lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:][sel].unsqueeze(-1)).squeeze(-1)
    out = torch.zeros(sel.shape, dtype=torch.float32).masked_scatter(sel, lp)
    return torch.cat([out.new_zeros((ids.shape[0], 1)), out], 1)


def bench_bare(model, batch, cfg, iters, clock=time.perf_counter):
    """The bare torch loop on ``batch``: (tokens, per-update times by ``clock``, micro-batches)."""
    from rllib_spear.learner.microbatching import slice_rows, token_budget_microbatches
    from rllib_spear.core.losses import LossNormalizer, policy_loss

    data = {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()}
    parts = token_budget_microbatches(data["attention_mask"], int(cfg.micro_batch_token_budget))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.adam_betas), weight_decay=cfg.weight_decay,
                            fused=True)
    loss_cfg = cfg.policy_loss_config()
    # the global normalizers the driver wrote on every row (one mini-batch, no replay rows)
    norm = LossNormalizer(float(data["norm_num_tokens"][0]), float(data["norm_num_seqs"][0]),
                          float(data["t_norm"][0]))
    tokens = int(data["attention_mask"].sum())
    model.train()
    times = []
    for _ in range(iters + 1):
        t0 = clock()
        opt.zero_grad(set_to_none=True)
        for part in parts:
            sub = slice_rows(data, part)
            mask = sub["loss_mask"].float()
            lp = bare_logprobs(model, sub["input_ids"].long(), sub["attention_mask"].long(), mask > 0,
                               float(cfg.temperature))
            loss, _ = policy_loss(lp, sub["old_logp"].float(), sub["advantages"].float(), mask,
                                  config=loss_cfg, normalizer=norm)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, float(cfg.grad_clip))
        opt.step()
        times.append(clock() - t0)
    return tokens, times[1:], len(parts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--algo", choices=["grpo", "spear"], default="grpo")
    ap.add_argument("--trajs", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--budget", type=int, default=0, help="micro_batch_token_budget (0 = the config default)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--spread", type=float, default=0.1, help="row lengths spread +- this fraction of --tokens")
    ap.add_argument("--packed", action="store_true",
                    help="also time the learner with learners(packed_microbatches=True)")
    ap.add_argument("--mixed-precision", default="",
                    help="comma-separated learners(mixed_precision=...) values (bf16, auto) also timed against "
                         "the float32 learner (auto: bf16 where this CPU has bf16 instructions)")
    ap.add_argument("--packed-attention", default="sdpa",
                    help="with --packed: comma-separated attention kernels of the packed learner, each timed "
                         "(sdpa: transformers' N x N mask; sdpa_varlen: one causal SDPA per document)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    import rllib_spear  # noqa: F401
    from rllib_spear import GRPOConfig, SPEARConfig
    from rllib_spear.models.factory import tiny_model_path
    from transformers import AutoModelForCausalLM

    path = tiny_model_path(hidden=args.hidden, layers=args.layers, vocab_size=args.vocab)
    cfg = ({"grpo": GRPOConfig, "spear": SPEARConfig}[args.algo]()
           .environment("search_qa").env_runners(num_env_runners=0)
           .rl_module(model_config={"model_path": path}).debugging(seed=0))
    if args.budget:
        cfg = cfg.training(micro_batch_token_budget=args.budget)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    trajs = synthetic_trajectories(args.trajs, args.tokens, model.config.vocab_size, spread=args.spread)
    rows = learner_rows(trajs)
    batch = learner_batch(rows, cfg)

    tok_b, t_bare, n_parts = bench_bare(model, batch, cfg, args.iters)
    tok_l, t_learn, metrics = bench_learner(cfg, rows, args.iters)
    _, t_bare2, _ = bench_bare(model, batch, cfg, args.iters)
    t_bare = t_bare + t_bare2
    bare = tok_b / float(np.median(t_bare))
    learn = tok_l / float(np.median(t_learn))
    print(f"model: {n_params / 1e6:.2f}M parameters (hidden {args.hidden}, layers {args.layers}, vocab "
          f"{args.vocab}); algo {args.algo}: entropy_coeff {cfg.entropy_coeff}, entropy_metric_tokens "
          f"{getattr(cfg, 'entropy_metric_tokens', '-')}, loss_mode {cfg.loss_mode}")
    print(f"batch: {args.trajs} trajectories, {tok_l} tokens, {n_parts} micro-batches "
          f"(budget {cfg.micro_batch_token_budget}), torch threads {torch.get_num_threads()}; "
          f"entropy metric logged: {'entropy' in metrics}")
    print(f"bare torch loop   : {bare:10.1f} tokens/s  (median {np.median(t_bare) * 1e3:.1f} ms/update, "
          f"spread {min(t_bare) * 1e3:.1f}-{max(t_bare) * 1e3:.1f})")
    print(f"GRPOTorchLearner  : {learn:10.1f} tokens/s  (median {np.median(t_learn) * 1e3:.1f} ms/update, "
          f"spread {min(t_learn) * 1e3:.1f}-{max(t_learn) * 1e3:.1f})")
    ratio = learn / bare
    print(f"ratio learner/bare: {ratio:.3f}x  (target >= 0.9x: {'OK' if ratio >= 0.9 else 'BELOW'})")
    for precision in [p for p in args.mixed_precision.split(",") if p]:
        mp_cfg = cfg.copy(copy_frozen=False).learners(mixed_precision=precision)
        tok_m, t_mixed, _ = bench_learner(mp_cfg, rows, args.iters)
        mixed = tok_m / float(np.median(t_mixed))
        print(f"learner, mixed_precision={precision:<5}: {mixed:10.1f} tokens/s  (median "
              f"{np.median(t_mixed) * 1e3:.1f} ms/update, spread {min(t_mixed) * 1e3:.1f}-"
              f"{max(t_mixed) * 1e3:.1f}); / float32 learner {mixed / learn:.3f}x")
    if args.packed:
        carried = padded_tokens(batch, cfg.micro_batch_token_budget)
        print(f"padded micro-batches carry {carried} tokens for {tok_l} real ones "
              f"({1 - tok_l / carried:.1%} padding)")
        for attn in [a for a in args.packed_attention.split(",") if a]:
            packed_cfg = (cfg.copy(copy_frozen=False).learners(packed_microbatches=True)
                          .rl_module(model_config={"model_path": path, "attn_implementation": attn}))
            tok_p, t_packed, _ = bench_learner(packed_cfg, rows, args.iters)
            packed = tok_p / float(np.median(t_packed))
            print(f"learner, packed {attn:<12}: {packed:10.1f} tokens/s  (median {np.median(t_packed) * 1e3:.1f} "
                  f"ms/update, spread {min(t_packed) * 1e3:.1f}-{max(t_packed) * 1e3:.1f}); "
                  f"packed/padded {packed / learn:.3f}x trained (real) tokens/s")


if __name__ == "__main__":
    main()
