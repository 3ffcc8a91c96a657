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
import sys
import time
from pathlib import Path
from typing import Sequence

import torch

from .factory import (atomic_build_dir, build_tiny_model, conversation_texts, default_cache_dir, hash_dir,
                      progress_bar, warmup_cosine)
from .shipped import SHIPPED_POLICIES, copy_shipped, data_hash, find_shipped, recipe_key, ship_build
from .tokenizer import assistant_token_mask

__all__ = ["cold_start_sft", "default_policy_path", "task_policy_path", "task_policy_env_config", "sft_examples",
           "default_policy_key", "task_policy_key", "default_policy_data_hash", "task_policy_data_hash",
           "DEFAULT_POLICY_RECIPE", "TASK_POLICY_RECIPE", "TASK_POLICY_OVERRIDES"]

logger = logging.getLogger(__name__)

_SFT_VERSION = 1


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
    length (shuffled with the seed), token-mean cross-entropy per batch. The hash covers the model
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
    # Stage 1: copy pre-training (rllib_spear.models.pretrain). Without it the model never learnt
    # to copy an entity into its query or an answer out of a passage (searching did not raise
    # success above guessing); with it, it copies ~86% of repeated tokens.
    copy_pretrain=dict(steps=1500, seq_len=128, batch_size=32, lr=3e-3, seed=0),
    # Stage 2: reading. Search demonstrations on other fictional worlds (same generator, other
    # seeds: same kind of names, different facts, so answers can only be read, not memorised),
    # every one searching, with the loss on all tokens.
    reading=dict(worlds=8, world_seed=5000, epochs=2, lr=3e-3, train_on="all", batch_size=16, max_len=512),
    # Stage 3: the task's own demonstrations, searching in ~20% of them (the cold start mostly
    # guesses); the <think> after a search quotes the retrieved clause that holds the answer.
    think="evidence",
    demo_passes=3,
    sft=dict(epochs=3, lr=1e-3, seed=0, max_len=512, batch_size=16),
    v=2,
)


def _task_conversations(recipe: dict) -> list[list[dict]]:
    import rllib_spear.envs as envs

    tasks = envs.load_tasks(recipe["task"])
    # Several passes over the tasks with different scripted choices: the same questions are
    # seen both answered directly and answered after a search.
    convs = []
    for k in range(int(recipe.get("demo_passes", 1))):
        convs += envs.scripted_demonstrations(
            recipe["task"], tasks, tool_use_rate=recipe["tool_use_rate"], seed=recipe["demo_seed"] + k,
            think=recipe.get("think", "plain"), env_config=recipe.get("env_config"),
        )
    return [list(c) for c in convs]


def reading_conversations(recipe: dict, root: Path) -> list[list[dict]]:
    """Search demonstrations (every one searching) of the recipe's task on
    ``recipe["reading"]["worlds"]`` fictional worlds other than the embedded one; their corpora
    are written under ``root/reading-worlds``. Empty unless the recipe has a ``reading`` stage and
    its task is a search task ("search_qa" or "multi_answer_search")."""
    reading = recipe.get("reading")
    if not reading or recipe["task"] not in ("search_qa", "multi_answer_search"):
        return []
    import pandas as pd

    import rllib_spear.envs as envs
    from rllib_spear.data.generate import build_world, corpus_rows, multi_answer_rows, search_qa_rows

    rows_of = search_qa_rows if recipe["task"] == "search_qa" else multi_answer_rows
    convs: list[list[dict]] = []
    folder = root / "reading-worlds"
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(int(reading["worlds"])):
        seed = int(reading["world_seed"]) + k
        world = build_world(seed=seed)
        corpus = folder / f"corpus-{seed}.parquet"
        if not corpus.exists():
            tmp = corpus.with_suffix(".tmp%d" % os.getpid())
            try:
                pd.DataFrame(corpus_rows(world)).to_parquet(tmp)
                os.replace(tmp, corpus)
            finally:  # an interrupted write leaves no partial file behind
                tmp.unlink(missing_ok=True)
        convs += envs.scripted_demonstrations(
            recipe["task"], rows_of(world, seed=seed), tool_use_rate=1.0, seed=100 + k,
            env_config={**(recipe.get("env_config") or {}), "corpus_path": str(corpus)},
            think=recipe.get("think", "plain"),
        )
    return [list(c) for c in convs]


def _default_task_data(recipe: dict) -> tuple[list[list[dict]], list[str]]:
    """(demonstration conversations, corpus texts) of the embedded task, from rllib_spear.envs and
    rllib_spear.data (imported lazily: the model layer does not need them otherwise)."""
    convs = _task_conversations(recipe)
    texts: list[str] = []
    if recipe.get("corpus", True):
        try:
            from rllib_spear.data import default_paths
            from rllib_spear.envs.retrieval import load_corpus

            _, titles, bodies = load_corpus(default_paths()["corpus"])
            texts = [f"{t}\n{b}" if t else b for t, b in zip(titles, bodies)]
        except (ImportError, KeyError) as e:  # pragma: no cover - depends on the data layer
            logger.warning("default policy: no corpus texts for the tokenizer (%s)", e)
    return convs, texts


def _say(message: str) -> None:
    """One progress line on stderr (builds run before any logging is configured, and in Ray
    actors whose stderr reaches the driver's console)."""
    print(f"[rllib_spear] {message}", file=sys.stderr, flush=True)


def _default_recipe(recipe: dict | None, task: str | None) -> dict:
    recipe = dict(DEFAULT_POLICY_RECIPE if recipe is None else recipe)
    if task is not None:
        recipe["task"] = task
    return recipe


def default_policy_key(recipe: dict | None = None, *, task: str | None = None) -> str:
    """The name of a default-policy build: :func:`rllib_spear.models.shipped.recipe_key` of the
    recipe and the data/demonstration versions. Cheap and machine-independent (no data replay)."""
    return recipe_key("default-policy", _default_recipe(recipe, task))


def default_policy_data_hash(recipe: dict | None = None, cache_dir: str | os.PathLike | None = None, *,
                             task: str | None = None) -> str:
    """:func:`rllib_spear.models.shipped.data_hash` of everything a default-policy build trains on
    (the task's demonstrations, the corpus texts of its tokenizer, the reading conversations),
    regenerated now: compare with a shipped build's ``manifest.json`` to see if it is fresh."""
    recipe = _default_recipe(recipe, task)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    convs, corpus = _default_task_data(recipe)
    return data_hash(convs, corpus, reading_conversations(recipe, root))


def default_policy_path(
    cache_dir: str | os.PathLike | None = None, *, task: str | None = None, recipe: dict | None = None,
    build: bool = False,
) -> str:
    """Return the embedded default policy: tokenizer + tiny model, copy pre-training, reading on
    other worlds, then cold-start SFT on the scripted demonstrations of ``task`` (default
    "search_qa"; any env name that ``rllib_spear.envs.scripted_demonstrations`` knows).

    Cached under ``cache_dir`` (default ``$RLLIB_SPEAR_CACHE`` or ``~/.cache/rllib_spear``) by
    :func:`default_policy_key`. A build of the default recipe ships with the package
    (``rllib_spear/assets``, found by its manifest: a hash and a file read); it is copied into the
    cache unless ``build=True`` or ``$RLLIB_SPEAR_BUILD_DEFAULT_POLICY=1``, which build from
    scratch (~12 min on 2 idle cores, with progress on stderr)."""
    recipe = _default_recipe(recipe, task)
    kind = "default-policy"
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = recipe_key(kind, recipe)
    found = _cached_or_shipped(root, kind, key, build)
    if found:
        return found
    _say(f"embedded default policy, recipe key {key}: "
         + ("build asked for" if _build_asked(build) else "no shipped or cached build")
         + "; replaying its demonstrations")
    convs, corpus = _default_task_data(recipe)
    reading = reading_conversations(recipe, root)
    trained_on = data_hash(convs, corpus, reading)
    found = _built(root, kind, key, trained_on)
    if found:
        return found
    _say(f"building it under {root} (~12 min on 2 cores)")
    _say("stage 1/4: the tokenizer and the initial model")
    base = root / f"default-base-{key}-{trained_on}"
    if not (base / "config.json").exists():
        texts = list(corpus) + conversation_texts(convs)
        with atomic_build_dir(base) as tmp:
            build_tiny_model(
                tmp, texts, arch=recipe["arch"], hidden=recipe["hidden"], layers=recipe["layers"],
                heads=recipe["heads"], vocab_size=recipe["vocab_size"],
                max_position_embeddings=recipe["max_position_embeddings"], seed=recipe["model_seed"],
            )
    start = base
    if recipe.get("copy_pretrain"):
        from .pretrain import copy_pretrain

        _say("stage 2/4: copy pre-training")
        start = Path(copy_pretrain(base, root, **recipe["copy_pretrain"]))
    return _reading_and_task_sft(start, reading, convs, recipe, root, (kind, key, trained_on), first_stage=3)


#: A task cold start derived from the default policy (``task_policy_path``): the same tokenizer
#: and skills, then the task's own demonstrations, using the tool in ~20% of them, like the
#: search task's cold start. ``TASK_POLICY_OVERRIDES`` changes it per task.
TASK_POLICY_RECIPE = dict(tool_use_rate=0.2, demo_seed=0, demo_passes=3,
                          sft=dict(epochs=3, lr=1e-3, seed=0, max_len=1536, batch_size=16), v=1)

#: Per-task changes to ``TASK_POLICY_RECIPE``.
#: multi_answer_search: Search-R1 calls (``<search>``, one query per turn), which the default
#: policy already makes on search_qa; with the JSON-list call formats the cold start never made a
#: well-formed call at T=1. Three passages per query and 3 turns keep an episode within ~400
#: tokens. A reading stage on 16 other worlds (every demonstration searching, loss on all tokens)
#: teaches it to copy the found entities into the answer list (docs/design.md, "Other tasks").
TASK_POLICY_OVERRIDES: dict[str, dict] = {
    "multi_answer_search": dict(
        env_config={"parser": "search_r1", "top_k": 3, "max_turns": 3},
        reading=dict(worlds=16, world_seed=5000, epochs=4, lr=3e-3, train_on="all", batch_size=16, max_len=768),
        v=2,
    ),
}


def task_policy_env_config(task: str) -> dict:
    """The env_config a task cold start (``task_policy_path``) was trained with; run RL on the task
    with it (e.g. ``config.environment("multi_answer_search", env_config=task_policy_env_config(
    "multi_answer_search"))``), since the policy only knows that call format."""
    return dict(TASK_POLICY_OVERRIDES.get(task, {}).get("env_config") or {})


def _task_recipe(task: str, recipe: dict | None) -> dict:
    if recipe is None:
        recipe = {**TASK_POLICY_RECIPE, **TASK_POLICY_OVERRIDES.get(task, {})}
    return {**recipe, "task": task}


def task_policy_key(task: str, recipe: dict | None = None) -> str:
    """The name of a task cold-start build: :func:`rllib_spear.models.shipped.recipe_key` of its
    recipe, the data/demonstration versions and the default policy's key (cheap, no data replay)."""
    return recipe_key(f"task-policy-{task}", _task_recipe(task, recipe), default_policy_key())


def task_policy_data_hash(task: str, recipe: dict | None = None, cache_dir: str | os.PathLike | None = None) -> str:
    """:func:`rllib_spear.models.shipped.data_hash` of what a task cold start trains on (its reading
    conversations and task demonstrations), regenerated now (see ``default_policy_data_hash``)."""
    recipe = _task_recipe(task, recipe)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return data_hash(reading_conversations(recipe, root), _task_conversations(recipe))


def task_policy_path(task: str, cache_dir: str | os.PathLike | None = None, *, recipe: dict | None = None,
                     build: bool = False) -> str:
    """A cold-start policy for another embedded task: the default policy (``default_policy_path``)
    fine-tuned on the scripted demonstrations of ``task`` (e.g. "multi_answer_search"), after a
    reading stage on other worlds when the task's recipe has one.

    The default policy only saw search_qa demonstrations, so on multi-answer questions it never
    lists entities (F1 0 in every sample: no learning signal). This keeps its tokenizer and skills
    and adds the task's format. "search_qa" returns the default policy itself. ``recipe``
    replaces ``TASK_POLICY_RECIPE`` updated with ``TASK_POLICY_OVERRIDES[task]``.

    Cached and shipped like ``default_policy_path`` (``rllib_spear/assets/task-policy-<task>-<key>``,
    by :func:`task_policy_key`); ``build=True`` or ``$RLLIB_SPEAR_BUILD_DEFAULT_POLICY=1`` build
    from scratch (multi_answer_search: ~9 min on 2 cores)."""
    if task == "search_qa":
        return default_policy_path(cache_dir, build=build)
    recipe = _task_recipe(task, recipe)
    kind = f"task-policy-{task}"
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = task_policy_key(task, recipe)
    found = _cached_or_shipped(root, kind, key, build)
    if found:
        return found
    start = default_policy_path(cache_dir, build=build)
    _say(f"{task} cold start, recipe key {key}: "
         + ("build asked for" if _build_asked(build) else "no shipped or cached build")
         + "; replaying its demonstrations")
    reading = reading_conversations(recipe, root)
    convs = _task_conversations(recipe)
    trained_on = data_hash(reading, convs)
    found = _built(root, kind, key, trained_on)
    if found:
        return found
    _say(f"building it under {root} (~9 min on 2 cores)")
    return _reading_and_task_sft(start, reading, convs, recipe, root, (kind, key, trained_on), first_stage=1)


def _reading_and_task_sft(start: str | Path, reading: list, convs: list, recipe: dict, root: Path,
                          build: tuple[str, str, str], first_stage: int) -> str:
    """The last two stages of a build: reading (if the recipe has one), then the task SFT; the
    result is recorded in the cache as the build of ``build = (kind, key, trained_on)``."""
    kind, key, trained_on = build
    last = first_stage + 1
    _say(f"stage {first_stage}/{last}: reading on {len(reading)} conversations of other worlds")
    start = _reading_sft(start, reading, recipe, root)
    _say(f"stage {last}/{last}: cold-start SFT on {len(convs)} task demonstrations")
    path = cold_start_sft(start, convs, root, **recipe["sft"])
    _say(f"{kind} built: {path}")
    return _point(root, kind, key, path, source="built", trained_on=trained_on)


def _reading_sft(start: str | Path, reading: list, recipe: dict, root: Path) -> str | Path:
    """The reading stage (``recipe["reading"]``) on ``reading``'s conversations, from ``start``;
    ``start`` itself when there are none."""
    if not reading:
        return start
    params = {k: v for k, v in recipe["reading"].items() if k not in ("worlds", "world_seed")}
    return cold_start_sft(start, reading, root, **params)


def _build_asked(build: bool) -> bool:
    return build or os.environ.get("RLLIB_SPEAR_BUILD_DEFAULT_POLICY") == "1"


def _pointer(root: Path, kind: str, key: str) -> dict | None:
    """The cache's record of the build of (kind, key), if it names a complete folder."""
    try:
        record = json.loads((root / f"{kind}-{key}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not (Path(record.get("path", "")) / "DONE").exists():
        return None
    return record


def _cached_or_shipped(root: Path, kind: str, key: str, build: bool) -> str | None:
    """Without ``build`` (or ``$RLLIB_SPEAR_BUILD_DEFAULT_POLICY=1``): the cached build of
    (kind, key), else the shipped one copied into the cache; None when neither exists (build it).
    With ``build``: None (the caller builds, reusing a cached build of the same data: ``_built``)."""
    if _build_asked(build):
        return None
    record = _pointer(root, kind, key)
    if record is not None:
        return record["path"]
    shipped = find_shipped(kind, key)
    if shipped is None:
        return None
    folder, manifest = shipped
    dest = copy_shipped(folder, manifest, root / f"sft-shipped-{kind}-{key}")
    return _point(root, kind, key, str(dest), source="shipped", trained_on=manifest.get("data_hash"))


def _built(root: Path, kind: str, key: str, trained_on: str) -> str | None:
    """A build of (kind, key) made here from the very data ``trained_on`` hashes, if cached."""
    record = _pointer(root, kind, key)
    if record is not None and record.get("source") == "built" and record.get("trained_on") == trained_on:
        return record["path"]
    return None


def _point(root: Path, kind: str, key: str, path: str, *, source: str, trained_on: str | None) -> str:
    pointer = root / f"{kind}-{key}.json"
    pointer.parent.mkdir(parents=True, exist_ok=True)
    tmp_ptr = pointer.with_suffix(".tmp%d" % os.getpid())
    tmp_ptr.write_text(json.dumps({"path": path, "source": source, "trained_on": trained_on}))
    os.replace(tmp_ptr, pointer)
    return path


def ship_default_policy(cache_dir: str | os.PathLike | None = None) -> Path:
    """Build the default recipe from scratch (or take this cache's build of the same data) and
    copy it with its manifest into ``SHIPPED_POLICIES``, replacing older shipped builds. Run
    ``python -m rllib_spear.models.sft`` after changing the recipe or the embedded data, and
    bump ``DATA_VERSION`` / ``DEMOS_VERSION`` when the generators or the demonstrations change."""
    path = Path(default_policy_path(cache_dir, build=True))
    return ship_build(path, "default-policy", default_policy_key(), DEFAULT_POLICY_RECIPE,
                      default_policy_data_hash(cache_dir=cache_dir))


#: Task cold starts that ship with the package (``python -m rllib_spear.models.sft`` rebuilds them).
SHIPPED_TASKS = ("multi_answer_search",)


def ship_task_policy(task: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Like ``ship_default_policy`` for ``task_policy_path(task)`` (run it after the default policy)."""
    path = Path(task_policy_path(task, cache_dir, build=True))
    return ship_build(path, f"task-policy-{task}", task_policy_key(task), _task_recipe(task, None),
                      task_policy_data_hash(task, cache_dir=cache_dir))


if __name__ == "__main__":  # pragma: no cover - maintenance entry point
    logging.basicConfig(level=logging.INFO)
    print(ship_default_policy())
    for _task in SHIPPED_TASKS:
        print(ship_task_policy(_task))
