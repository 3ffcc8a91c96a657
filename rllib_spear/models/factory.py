"""Tiny causal LMs built from scratch (no downloads): the embedded default policy and test models.

``build_tiny_model`` trains a ChatML tokenizer on the given texts, builds a Qwen2 or Llama model
of about 1-5M parameters with tied embeddings and ``head_dim >= 32`` (vLLM's CPU attention needs
it), and writes both with ``save_pretrained``, so the folder loads in the HF and the vLLM engine.
``tiny_model_path`` is a cached build on synthetic chat data for tests of other layers.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

from ..cache_paths import cache_root

__all__ = [
    "build_tiny_model",
    "tiny_model_path",
    "synthetic_conversations",
    "conversation_texts",
    "atomic_build_dir",
    "progress_bar",
]


def hash_dir(path: Path, h) -> None:
    """Feed the names and bytes of ``path``'s visible files, in name order, into hash ``h``."""
    for f in sorted(Path(path).iterdir()):
        if f.is_file() and not f.name.startswith("."):
            h.update(f.name.encode())
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)


def warmup_cosine(optimizer, total: int, warm: int):
    """LambdaLR: linear warmup over ``warm`` steps, then cosine decay to 0 at ``total``:
    lr_s = lr * (s+1)/warm for s < warm, else lr * (1 + cos(pi (s-warm)/(total-warm))) / 2."""
    import math

    import torch

    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, total - warm))),
    )


def progress_bar(total: int, desc: str):
    """A tqdm bar on stderr for a long build step (a model build runs before logging is set up and
    inside Ray actors, whose stderr reaches the driver). Redraws at most every 2 s on a terminal
    and every 15 s elsewhere (CI logs, Ray actors), so a log does not flood."""
    import sys

    from tqdm.auto import tqdm

    interval = 2.0 if sys.stderr.isatty() else 15.0
    return tqdm(total=total, desc=f"[rllib_spear] {desc}", file=sys.stderr, mininterval=interval,
                maxinterval=max(interval, 10.0), dynamic_ncols=True, leave=True)


class atomic_build_dir:
    """Context manager: build into a temp dir beside ``final`` and rename it into place on success.

    ``with atomic_build_dir(final) as tmp: ...`` -- if ``final`` already exists when the block
    ends (a concurrent builder won), the temp dir is discarded.
    """

    def __init__(self, final: str | os.PathLike):
        self.final = Path(final)

    def __enter__(self) -> Path:
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.final.name}.", dir=self.final.parent))
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        try:
            os.rename(self.tmp, self.final)
        except OSError:
            if not (self.final / "config.json").exists() and not (self.final / "DONE").exists():
                raise
            shutil.rmtree(self.tmp, ignore_errors=True)


def build_tiny_model(
    out_dir: str | os.PathLike,
    texts: Iterable[str],
    *,
    arch: str = "qwen2",
    hidden: int = 128,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int | None = None,
    intermediate: int | None = None,
    vocab_size: int = 1024,
    max_position_embeddings: int = 2048,
    seed: int = 0,
    tokenizer=None,
) -> str:
    """Train a tokenizer on ``texts`` (unless ``tokenizer`` is given), build a randomly initialised
    ``arch`` ("qwen2" or "llama") causal LM with tied embeddings, save both to ``out_dir``.

    ``heads`` sets ``head_dim = hidden // heads`` (must be >= 32). The model's vocabulary is the
    tokenizer's actual size (BPE may learn fewer merges than ``vocab_size``). Deterministic for a
    seed. Returns ``out_dir`` as a string.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from .tokenizer import train_chat_tokenizer

    if hidden % heads:
        raise ValueError(f"hidden={hidden} must be divisible by heads={heads}")
    head_dim = hidden // heads
    if head_dim < 32:
        raise ValueError(f"head_dim = hidden/heads = {head_dim} < 32; vLLM's CPU attention needs >= 32")
    kv_heads = kv_heads or heads
    intermediate = intermediate or 3 * hidden
    if tokenizer is None:
        tokenizer = train_chat_tokenizer(texts, vocab_size=vocab_size)
    vocab = len(tokenizer)
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.02,
    )
    if arch == "qwen2":
        cfg, cls = Qwen2Config(**common, rope_theta=10000.0), Qwen2ForCausalLM
    elif arch == "llama":
        cfg, cls = LlamaConfig(**common, rope_theta=10000.0), LlamaForCausalLM
    else:
        raise ValueError(f"arch must be 'qwen2' or 'llama', got {arch!r}")
    cpu_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = cls(cfg).to(torch.float32)
    finally:
        torch.random.set_rng_state(cpu_state)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


# --------------------------------------------------------------------------------------------
# Synthetic chat data (tests, and a fallback corpus)

_NAMES = ["Alba", "Borin", "Cela", "Dorn", "Essa", "Farel", "Gyre", "Hollis", "Ivo", "Juna"]
_THINGS = ["lighthouse", "orchard", "bridge", "library", "harbor", "tower", "garden", "mill"]
_CITIES = ["Veloria", "Quenth", "Marrow", "Istel", "Panoth", "Drelle", "Oskar", "Tamsin"]


def synthetic_conversations(n: int = 64, seed: int = 0, *, tool_use_rate: float = 0.5) -> list[list[dict]]:
    """``n`` small search-style conversations in the project's tag format (system, user,
    assistant with ``<search>``/``<answer>`` tags, user turns with ``<information>``).
    Deterministic for a seed; used by tests and as a fallback corpus."""
    rng = random.Random(seed)
    system = (
        "Answer the question. You may search with <search>query</search>; results come back in "
        "<information>...</information>. Give the final answer as <answer>...</answer>."
    )
    convs = []
    for _ in range(n):
        name, thing, city = rng.choice(_NAMES), rng.choice(_THINGS), rng.choice(_CITIES)
        year = rng.randint(1200, 1999)
        q = f"In which city did {name} build the {thing}?"
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": q}]
        if rng.random() < tool_use_rate:
            msgs.append({"role": "assistant", "content": f"<search>{name} {thing}</search>"})
            msgs.append(
                {
                    "role": "user",
                    "content": f"<information>{name} built the {thing} in {city} in {year}.</information>",
                }
            )
        msgs.append({"role": "assistant", "content": f"<answer>{city}</answer>"})
        convs.append(msgs)
    return convs


def conversation_texts(tokenizer_free_convs: Sequence[Sequence[dict]]) -> list[str]:
    """ChatML renderings of conversations (plain strings, no tokenizer needed): tokenizer corpus."""
    out = []
    for msgs in tokenizer_free_convs:
        out.append("".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs))
    return out


def tiny_model_path(
    cache_dir: str | os.PathLike | None = None,
    *,
    arch: str = "qwen2",
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    vocab_size: int = 512,
    seed: int = 0,
) -> str:
    """A cached, untrained tiny model (tokenizer trained on ``synthetic_conversations``) for tests
    of any layer; built once per parameter set under ``cache_dir/tiny-<hash>``."""
    params = dict(arch=arch, hidden=hidden, layers=layers, heads=heads, vocab_size=vocab_size, seed=seed, v=1)
    key = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]
    final = Path(cache_dir) if cache_dir is not None else cache_root()
    final = final / f"tiny-{arch}-{key}"
    if (final / "config.json").exists():
        return str(final)
    texts = conversation_texts(synthetic_conversations(200, seed=seed))
    with atomic_build_dir(final) as tmp:
        build_tiny_model(
            tmp, texts, arch=arch, hidden=hidden, layers=layers, heads=heads, vocab_size=vocab_size, seed=seed
        )
    return str(final)
