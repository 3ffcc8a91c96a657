"""What bf16 master weights do to an AdamW step, vs fp32 master weights with bf16 compute.

One policy-gradient-like step (loss = -mean token log-prob x random advantages) on the project's
tiny model, from the same weights and batch, with AdamW (betas 0.9/0.999, wd 0.01) at lr 1e-6 and
1e-5, in three precisions:

* ``fp32``: fp32 weights, fp32 compute (the reference update);
* ``fp32-master + bf16 autocast``: what ``learners(mixed_precision="bf16")`` does (FSDP2's
  MixedPrecisionPolicy keeps fp32 master shards the same way);
* ``bf16 weights + bf16 AdamW``: ``model_config["dtype"]="bfloat16"`` without mixed precision.

Printed per precision: the fraction of weights that changed at all, and the mean applied step
|w_after - w_before| as a fraction of the fp32 reference step. ``validate()`` quotes the bf16 row.

    python benchmarks/master_weights.py
"""
from __future__ import annotations

import argparse
import contextlib

import torch


def one_step(path: str, *, lr: float, weights: torch.dtype, autocast: bool, ids, mask, adv):
    from transformers import AutoModelForCausalLM

    from rllib_spear.core.losses import masked_mean
    from rllib_spear.models.logprobs import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(path, dtype=weights)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=0.01)
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with ctx:
        logp = token_logprobs(model, ids, mask)
    loss = masked_mean(-logp.float() * adv, mask)  # a policy-gradient surrogate, token mean
    loss.backward()
    opt.step()
    return {k: (v.detach().float() - before[k].float()) for k, v in model.named_parameters()}, before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--length", type=int, default=128)
    args = ap.parse_args()
    from rllib_spear.models.factory import tiny_model_path

    path = tiny_model_path()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 400, (args.rows, args.length), generator=g)
    mask = torch.ones_like(ids)
    adv = torch.randn(args.rows, 1, generator=g)
    print(f"model {path}: {args.rows} rows x {args.length} tokens, one AdamW step")
    print(f"{'lr':>6}  {'precision':<30} {'weights changed':>16} {'mean step / fp32 step':>22}")
    for lr in (1e-6, 1e-5):
        ref, _ = one_step(path, lr=lr, weights=torch.float32, autocast=False, ids=ids, mask=mask, adv=adv)
        ref_mean = torch.cat([d.abs().flatten() for d in ref.values()]).mean()
        for name, dtype, auto in (("fp32", torch.float32, False),
                                  ("fp32-master + bf16 autocast", torch.float32, True),
                                  ("bf16 weights + bf16 AdamW", torch.bfloat16, False)):
            delta, _ = one_step(path, lr=lr, weights=dtype, autocast=auto, ids=ids, mask=mask, adv=adv)
            flat = torch.cat([d.abs().flatten() for d in delta.values()])
            changed = float((flat > 0).float().mean())
            ratio = float(flat.mean() / ref_mean)
            print(f"{lr:>6.0e}  {name:<30} {changed:>15.1%} {ratio:>22.3f}", flush=True)


if __name__ == "__main__":
    main()
