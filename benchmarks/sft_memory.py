"""Peak memory of one cold-start SFT step: ``models.sft.sft_loss`` (the output head on the
labelled positions only, in checkpointed chunks) against the full-logits cross-entropy it
replaced, each in a fresh process (peak RSS from ``getrusage``).

The model is SmolLM2-135M-Instruct's shape (the bundled config, random init, no download), the
batch that of the ``"smollm2-tools"`` cold start: ``--batch 4`` rows of ``--tokens 1024``, a
third of the positions labelled (the assistant tokens), AdamW over fp32 weights as
``cold_start_sft`` runs it.

    python benchmarks/sft_memory.py [--batch 4] [--tokens 1024] [--layers 30] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[1] / "rllib_spear" / "assets" / "model_configs" / "SmolLM2-135M-Instruct.json"
LOSSES = ("full_logits", "sft_loss")


def one_step(loss_name: str, batch: int, tokens: int, layers: int, threads: int) -> dict:
    import torch
    import transformers

    from rllib_spear.models.sft import sft_loss

    torch.set_num_threads(threads)
    d = json.loads(CONFIG.read_text())
    cfg = transformers.LlamaConfig(**{k: v for k, v in d.items() if k not in ("architectures", "model_type")})
    cfg.num_hidden_layers = layers
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).float().train()
    ids = torch.randint(0, cfg.vocab_size, (batch, tokens))
    att = torch.ones_like(ids)
    labels = torch.where(torch.rand(batch, tokens) < 1 / 3, ids, torch.full_like(ids, -100))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    t0 = time.perf_counter()
    if loss_name == "sft_loss":
        loss = sft_loss(model, ids, att, labels)
    else:
        logits = model(input_ids=ids, attention_mask=att, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                                 labels[:, 1:].reshape(-1), ignore_index=-100)
    loss.backward()
    opt.step()
    return {"loss": loss_name, "value": float(loss.detach()), "seconds": time.perf_counter() - t0,
            "params": sum(p.numel() for p in model.parameters()), "vocab": cfg.vocab_size,
            "rss_before_step_gb": before, "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=30, help="decoder layers (SmolLM2-135M: 30)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--one", choices=LOSSES, help=argparse.SUPPRESS)  # the child process
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one_step(args.one, args.batch, args.tokens, args.layers, args.threads)))
        return
    print(f"one SFT step, SmolLM2-135M shape with {args.layers} layers, {args.batch} x {args.tokens} tokens "
          f"(a third labelled), {args.threads} threads; each loss in a fresh process", flush=True)
    rows = []
    for name in LOSSES:
        res = subprocess.run([sys.executable, __file__, "--one", name, "--batch", str(args.batch), "--tokens",
                              str(args.tokens), "--layers", str(args.layers), "--threads", str(args.threads)],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{name:<12} peak RSS {r['peak_rss_gb']:6.2f} GB (before the step {r['rss_before_step_gb']:.2f} GB), "
              f"step {r['seconds']:.1f} s, loss {r['value']:.6f}", flush=True)
    full, ours = rows
    print(f"params {full['params'] / 1e6:.1f}M, vocab {full['vocab']}: the step's own peak (peak - before) "
          f"{full['peak_rss_gb'] - full['rss_before_step_gb']:.2f} GB -> {ours['peak_rss_gb'] - ours['rss_before_step_gb']:.2f} GB; "
          f"loss difference {abs(full['value'] - ours['value']):.2e}")


if __name__ == "__main__":
    main()
