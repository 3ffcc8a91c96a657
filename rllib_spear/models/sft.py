"""Cold-start supervised fine-tuning on chat demonstrations, and the embedded default policy.

``cold_start_sft`` trains on assistant tokens only (``assistant_token_mask``), deterministically
for a seed, and caches its result under ``out_dir/sft-<hash of inputs and params>``: a second call
with the same model, data and parameters returns the cached folder at once.

``default_policy_path`` builds the project's default policy from nothing: a tokenizer trained on
the embedded search task's corpus and demonstrations, a tiny Qwen2 model, and a cold-start SFT on
scripted demonstrations (``rllib_spear.envs.scripted_demonstrations``).
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

from .factory import atomic_build_dir, build_tiny_model, conversation_texts, default_cache_dir
from .tokenizer import assistant_token_mask

__all__ = ["cold_start_sft", "default_policy_path", "sft_examples", "DEFAULT_POLICY_RECIPE"]

logger = logging.getLogger(__name__)

_SFT_VERSION = 1


def _hash_dir(path: Path, h) -> None:
    for f in sorted(path.iterdir()):
        if f.is_file() and not f.name.startswith("."):
            h.update(f.name.encode())
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)


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
) -> str:
    """Fine-tune ``model_path`` on ``conversations`` (lists of chat messages) with the loss on
    assistant tokens only; save model and tokenizer to ``out_dir/sft-<hash>`` and return it.

    Deterministic for a seed (CPU). AdamW, linear warmup then cosine decay, batches of similar
    length (shuffled with the seed), token-mean cross-entropy per batch. The hash covers the model
    folder's files, the conversations and every parameter, so a cached result is reused only for
    the very same inputs.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_path = Path(model_path)
    params = dict(
        epochs=epochs, lr=lr, seed=seed, max_len=max_len, batch_size=batch_size,
        weight_decay=weight_decay, warmup_frac=warmup_frac, v=_SFT_VERSION,
    )
    h = hashlib.sha256()
    _hash_dir(model_path, h)
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
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt,
            lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, total - warm))),
        )
        step = 0
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
                logits = model(input_ids=ids, attention_mask=att, use_cache=False).logits
                loss = torch.nn.functional.cross_entropy(
                    logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1), ignore_index=-100
                )
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                step += 1
                if log_every and step % log_every == 0:
                    logger.info("sft step %d/%d epoch %d loss %.4f", step, total, ep, loss.item())
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


# --------------------------------------------------------------------------------------------
# The embedded default policy

#: Everything that shapes the default policy; part of its cache key.
DEFAULT_POLICY_RECIPE = dict(
    task="search_qa",
    tool_use_rate=0.2,
    demo_seed=0,
    arch="qwen2",
    hidden=192,  # 2 wide layers train ~2x faster than 4 narrow ones on CPU at the same size
    layers=2,
    heads=3,  # head_dim 64
    vocab_size=1024,
    max_position_embeddings=2048,
    model_seed=0,
    # 3 passes x 6 epochs: the format, and a 6-7% search rate at temperature 1 (1 pass x 3
    # epochs left it at ~2%, too rare for RL to find). Builds in ~5 min on 2 idle cores.
    demo_passes=3,
    sft=dict(epochs=6, lr=3e-3, seed=0, max_len=512, batch_size=16),
    v=1,
)


def _default_task_data(recipe: dict) -> tuple[list[list[dict]], list[str]]:
    """(demonstration conversations, corpus texts) of the embedded task, from rllib_spear.envs and
    rllib_spear.data (imported lazily: the model layer does not need them otherwise)."""
    import rllib_spear.envs as envs

    tasks = envs.load_tasks(recipe["task"])
    # Several passes over the tasks with different scripted choices: the same questions are
    # seen both answered directly and answered after a search.
    convs = []
    for k in range(int(recipe.get("demo_passes", 1))):
        convs += envs.scripted_demonstrations(
            recipe["task"], tasks, tool_use_rate=recipe["tool_use_rate"], seed=recipe["demo_seed"] + k
        )
    texts: list[str] = []
    if recipe.get("corpus", True):
        try:
            from rllib_spear.data import default_paths
            from rllib_spear.envs.retrieval import load_corpus

            _, titles, bodies = load_corpus(default_paths()["corpus"])
            texts = [f"{t}\n{b}" if t else b for t, b in zip(titles, bodies)]
        except (ImportError, KeyError) as e:  # pragma: no cover - depends on the data layer
            logger.warning("default policy: no corpus texts for the tokenizer (%s)", e)
    return [list(c) for c in convs], texts


def default_policy_path(
    cache_dir: str | os.PathLike | None = None, *, task: str | None = None, recipe: dict | None = None
) -> str:
    """Build (once) and return the embedded default policy: tokenizer + tiny model + cold-start
    SFT on the scripted demonstrations of ``task`` (default "search_qa"; any env name that
    ``rllib_spear.envs.scripted_demonstrations`` knows). Cached under ``cache_dir`` (default
    ``$RLLIB_SPEAR_CACHE`` or ``~/.cache/rllib_spear``), keyed by the recipe and the data."""
    recipe = dict(DEFAULT_POLICY_RECIPE if recipe is None else recipe)
    if task is not None:
        recipe["task"] = task
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    convs, corpus = _default_task_data(recipe)
    h = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode())
    h.update(json.dumps(convs, sort_keys=True).encode())
    h.update(json.dumps(corpus, sort_keys=True).encode())
    key = h.hexdigest()[:16]
    pointer = root / f"default-policy-{key}.json"
    if pointer.exists():
        path = json.loads(pointer.read_text())["path"]
        if (Path(path) / "DONE").exists():
            return path
    base = root / f"default-base-{key}"
    if not (base / "config.json").exists():
        texts = list(corpus) + conversation_texts(convs)
        with atomic_build_dir(base) as tmp:
            build_tiny_model(
                tmp, texts, arch=recipe["arch"], hidden=recipe["hidden"], layers=recipe["layers"],
                heads=recipe["heads"], vocab_size=recipe["vocab_size"],
                max_position_embeddings=recipe["max_position_embeddings"], seed=recipe["model_seed"],
            )
    path = cold_start_sft(base, convs, root, **recipe["sft"])
    tmp_ptr = pointer.with_suffix(".tmp%d" % os.getpid())
    tmp_ptr.write_text(json.dumps({"path": path}))
    os.replace(tmp_ptr, pointer)
    return path
