"""Cold-start supervised fine-tuning on chat demonstrations.

``cold_start_sft`` trains on assistant tokens only (``assistant_token_mask``), deterministically
for a seed, and caches its result under ``out_dir/sft-<hash of inputs and params>``: a second call
with the same model, data and parameters returns the cached folder at once.

The embedded cold starts built with it (recipes, demonstrations, shipped builds) live in
``rllib_spear.coldstart``; this module knows nothing of tasks or environments.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import time
from pathlib import Path
from typing import Sequence

import torch

from .factory import atomic_build_dir, hash_dir, progress_bar, warmup_cosine
from .logprobs import body_and_head
from .tokenizer import assistant_token_mask

__all__ = ["cold_start_sft", "sft_examples", "sft_loss", "SFT_HEAD_CHUNK_ROWS"]

logger = logging.getLogger(__name__)

# 2: the loss runs the output head on the labelled positions only, in checkpointed chunks
# (``sft_loss``): the same loss as version 1's full-logits cross-entropy up to float32 rounding.
_SFT_VERSION = 2

#: Positions whose logits ``sft_loss`` computes at once (recomputed in backward).
SFT_HEAD_CHUNK_ROWS = 1024


def _chunk_nll_sum(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(head(hidden).float(), targets, reduction="sum")


def sft_loss(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor, *,
             chunk_rows: int = SFT_HEAD_CHUNK_ROWS) -> torch.Tensor:
    """Token-mean next-token cross-entropy over the labelled positions (``labels != -100``):

        L = (1/N) * sum_{(r, t): labels[r, t+1] != -100} -log softmax(W h[r, t])[labels[r, t+1]]

    with ``h`` the decoder body's last hidden states and ``W`` the output head, run on those N
    positions only and ``chunk_rows`` at a time under activation checkpointing. No ``[B, T, V]``
    logits exist: with SmolLM2's 49,152-token vocabulary a batch of 4 x 1024 made 0.8 GB per copy
    of them, and one step of the full-logits loss peaked at 9.5 GB against 8.0 GB here, 1.34x
    slower (``benchmarks/sft_memory.py``; the rest is the body's activations). Equal to the
    full-logits ``cross_entropy(..., ignore_index=-100)`` up to float32 rounding
    (tests/models/test_factory_sft.py)."""
    from torch.utils.checkpoint import checkpoint

    body, head = body_and_head(model)
    hidden = body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    keep = labels[:, 1:] != -100
    rows, targets = hidden[:, :-1][keep], labels[:, 1:][keep]
    if targets.numel() == 0:
        raise ValueError("sft_loss: no labelled position (every label is -100)")
    total = hidden.new_zeros((), dtype=torch.float32)
    for s in range(0, targets.numel(), int(chunk_rows)):
        total = total + checkpoint(_chunk_nll_sum, head, rows[s:s + chunk_rows], targets[s:s + chunk_rows],
                                   use_reentrant=False)
    return total / targets.numel()


def sft_examples(tokenizer, conversations: Sequence[Sequence[dict]], max_len: int) -> list[tuple[list[int], list[int]]]:
    """(input_ids, assistant mask) per conversation, truncated to ``max_len``; conversations with
    no assistant token left after truncation are dropped."""
    out = []
    for conv in conversations:
        ids, mask = assistant_token_mask(tokenizer, conv)
        ids, mask = ids[:max_len], mask[:max_len]
        if any(mask[1:]):
            out.append((ids, mask))
    return out


def cold_start_sft(
    model_path: str | os.PathLike,
    conversations: Sequence[Sequence[dict]],
    out_dir: str | os.PathLike,
    *,
    epochs: int = 3,
    lr: float = 3e-3,
    seed: int = 0,
    max_len: int = 512,
    batch_size: int = 16,
    weight_decay: float = 0.0,
    warmup_frac: float = 0.05,
    log_every: int = 0,
    train_on: str = "assistant",
) -> str:
    """Fine-tune ``model_path`` on ``conversations`` (lists of chat messages) with the loss on
    assistant tokens only; save model and tokenizer to ``out_dir/sft-<hash>`` and return it.

    ``train_on="all"`` puts the loss on every token (language modelling over the whole
    conversation, tool observations included): a pre-training phase in which a small model learns
    to read and copy from its context, which the assistant tokens alone teach too slowly.

    Deterministic for a seed (CPU). AdamW, linear warmup then cosine decay, batches of similar
    length (shuffled with the seed), token-mean cross-entropy per batch (:func:`sft_loss`: the
    output head on the labelled positions only, in chunks). The hash covers the model
    folder's files, the conversations and every parameter, so a cached result is reused only for
    the very same inputs.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if train_on not in ("assistant", "all"):
        raise ValueError(f"train_on must be 'assistant' or 'all', got {train_on!r}")
    model_path = Path(model_path)
    params = dict(
        epochs=epochs, lr=lr, seed=seed, max_len=max_len, batch_size=batch_size,
        weight_decay=weight_decay, warmup_frac=warmup_frac, v=_SFT_VERSION,
    )
    if train_on != "assistant":  # keeps the cache keys of assistant-only runs unchanged
        params["train_on"] = train_on
    h = hashlib.sha256()
    hash_dir(model_path, h)
    h.update(json.dumps(params, sort_keys=True).encode())
    h.update(json.dumps([list(c) for c in conversations], sort_keys=True).encode())
    final = Path(out_dir) / f"sft-{h.hexdigest()[:16]}"
    if (final / "DONE").exists():
        return str(final)

    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(model_path)
    cpu_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        model.train()
        data = sft_examples(tok, conversations, max_len)
        if train_on == "all":
            data = [(ids, [1] * len(ids)) for ids, _ in data]
        if not data:
            raise ValueError("cold_start_sft: no conversation has an assistant token")
        rng = random.Random(seed)
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0

        def batches():
            order = list(range(len(data)))
            rng.shuffle(order)
            # length-bucketed: sort windows of 8 batches by length, then shuffle the batches
            win = batch_size * 8
            out = []
            for s in range(0, len(order), win):
                chunk = sorted(order[s : s + win], key=lambda i: len(data[i][0]))
                out += [chunk[j : j + batch_size] for j in range(0, len(chunk), batch_size)]
            rng.shuffle(out)
            return out

        steps_per_epoch = math.ceil(len(data) / batch_size)
        total = max(1, steps_per_epoch * epochs)
        warm = max(1, int(total * warmup_frac))
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.98))
        sched = warmup_cosine(opt, total, warm)
        step = 0
        bar = progress_bar(total, f"SFT ({len(data)} conversations, {epochs} epochs)")
        for ep in range(epochs):
            for b in batches():
                T = max(len(data[i][0]) for i in b)
                ids = torch.full((len(b), T), pad, dtype=torch.long)
                att = torch.zeros((len(b), T), dtype=torch.long)
                labels = torch.full((len(b), T), -100, dtype=torch.long)
                for r, i in enumerate(b):
                    x, m = data[i]
                    ids[r, : len(x)] = torch.tensor(x)
                    att[r, : len(x)] = 1
                    labels[r, : len(x)] = torch.where(torch.tensor(m, dtype=torch.bool), torch.tensor(x), -100)
                loss = sft_loss(model, ids, att, labels)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                step += 1
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
                if log_every and step % log_every == 0:
                    logger.info("sft step %d/%d epoch %d loss %.4f", step, total, ep, loss.item())
        bar.close()
        model.eval()
        with atomic_build_dir(final) as tmp:
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            (tmp / "sft_meta.json").write_text(
                json.dumps(
                    {**params, "base": str(model_path), "examples": len(data), "steps": step,
                     "final_loss": float(loss.item()), "seconds": time.time() - t0},
                    indent=1,
                )
            )
            (tmp / "DONE").write_text("ok\n")
    finally:
        torch.random.set_rng_state(cpu_state)
    return str(final)
