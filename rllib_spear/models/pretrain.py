"""Copy pre-training: teach a freshly initialised small model to copy from its context.

A tool-using policy must copy: the entity of the question into its search query, the answer out of
the retrieved passage. Transformers do this with induction heads ("find the earlier occurrence of
the current token, predict what followed it"), which emerge only late in ordinary language-model
training - far later than a CPU budget allows for the embedded model. Training directly on
sequences whose second half repeats spans of the first half makes the copy the only way to lower
the loss, and the heads form within a couple of thousand small steps.

``copy_pretrain`` does that on random token spans drawn from the tokenizer's ordinary vocabulary
and caches the result like :func:`rllib_spear.models.sft.cold_start_sft`.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import time
from pathlib import Path

import torch

from .factory import atomic_build_dir, hash_dir, progress_bar, warmup_cosine

__all__ = ["copy_pretrain", "copy_sequences", "copy_accuracy"]

_VERSION = 1


def copy_sequences(vocab: list[int], n: int, seq_len: int, rng: random.Random) -> torch.Tensor:
    """``n`` rows of ``seq_len`` token ids: a random first half, then a second half made of spans
    (2-12 tokens) copied from the first half, each preceded by the token that preceded it there,
    so that every copied token is predictable from context and only from context."""
    half = seq_len // 2
    rows = []
    for _ in range(n):
        first = [rng.choice(vocab) for _ in range(half)]
        second: list[int] = []
        while len(second) < seq_len - half:
            length = rng.randint(2, 12)
            start = rng.randrange(0, half - length)
            second += first[start : start + length]
        rows.append(first + second[: seq_len - half])
    return torch.tensor(rows, dtype=torch.long)


def copy_accuracy(model, tokenizer, n: int = 64, seq_len: int = 128, seed: int = 123) -> float:
    """Greedy next-token accuracy on the second half of ``n`` fresh copy sequences (~0.86 is the
    ceiling: span starts are unpredictable; chance is 1/vocabulary)."""
    vocab = [i for i in range(len(tokenizer)) if i not in set(tokenizer.all_special_ids)]
    ids = copy_sequences(vocab, n, seq_len, random.Random(seed))
    with torch.no_grad():
        pred = model(input_ids=ids).logits.argmax(-1)
    half = seq_len // 2
    return (pred[:, half:-1] == ids[:, half + 1 :]).float().mean().item()


def copy_pretrain(
    model_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    steps: int = 1500,
    seq_len: int = 128,
    batch_size: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
) -> str:
    """Train ``model_path`` (a ``save_pretrained`` folder with its tokenizer) on
    :func:`copy_sequences` with the loss on the second half of each row; save to
    ``out_dir/copy-<hash>`` and return it (cached: same inputs, same folder).

    AdamW, linear warmup (5%) then cosine decay, gradient clipping at 1. Deterministic for a seed.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_path = Path(model_path)
    params = dict(steps=steps, seq_len=seq_len, batch_size=batch_size, lr=lr, seed=seed, v=_VERSION)
    h = hashlib.sha256(json.dumps(params, sort_keys=True).encode())
    hash_dir(model_path, h)
    final = Path(out_dir) / f"copy-{h.hexdigest()[:16]}"
    if (final / "DONE").exists():
        return str(final)

    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(model_path)
    special = set(tok.all_special_ids)
    vocab = [i for i in range(len(tok)) if i not in special]
    cpu_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        model.train()
        rng = random.Random(seed)
        warm = max(1, steps // 20)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
        sched = warmup_cosine(opt, steps, warm)
        half = seq_len // 2
        bar = progress_bar(steps, "copy pre-training")
        for _ in range(steps):
            ids = copy_sequences(vocab, batch_size, seq_len, rng)
            logits = model(input_ids=ids, use_cache=False).logits
            # predict tokens half+1 .. end (the first copied token's span start is not predictable)
            loss = torch.nn.functional.cross_entropy(
                logits[:, half:-1].reshape(-1, logits.shape[-1]).float(), ids[:, half + 1 :].reshape(-1)
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        bar.close()
        model.eval()
        with atomic_build_dir(final) as tmp:
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            (tmp / "copy_meta.json").write_text(
                json.dumps({**params, "base": str(model_path), "final_loss": float(loss.item()),
                            "seconds": time.time() - t0}, indent=1)
            )
            (tmp / "DONE").write_text("ok\n")
    finally:
        torch.random.set_rng_state(cpu_state)
    return str(final)
