"""The cold-start builds: the embedded default policy and the task cold starts derived from it.

``default_policy_path`` builds the project's default policy from nothing: a tokenizer trained on
the embedded search task's corpus and demonstrations, a tiny Qwen2 model
(``rllib_spear.models.factory``), copy pre-training (``rllib_spear.models.pretrain``), a reading
stage on other fictional worlds and a cold-start SFT (``rllib_spear.models.sft``) on scripted
demonstrations (``coldstart.data``). ``task_policy_path`` fine-tunes it on another task.

Both look in the cache first, then for a shipped build (``coldstart.lookup``), and build only
when neither exists or a build is asked for; the cache keeps one pointer file per build,
``<cache>/<kind>-<key>.json``, naming its folder and where it came from.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from rllib_spear.cache_paths import cache_root
from rllib_spear.models.factory import atomic_build_dir, build_tiny_model, conversation_texts

from .data import data_hash, default_task_data, reading_conversations, task_conversations
from .lookup import copy_shipped, find_shipped
from .recipes import default_recipe, recipe_key, task_policy_key, task_recipe

__all__ = ["default_policy_path", "task_policy_path"]


def _say(message: str) -> None:
    """One progress line on stderr (builds run before any logging is configured, and in Ray
    actors whose stderr reaches the driver's console)."""
    print(f"[rllib_spear] {message}", file=sys.stderr, flush=True)


def _root(cache_dir: str | os.PathLike | None) -> Path:
    return Path(cache_dir) if cache_dir is not None else cache_root()


def default_policy_path(
    cache_dir: str | os.PathLike | None = None, *, task: str | None = None, recipe: dict | None = None,
    build: bool = False,
) -> str:
    """Return the embedded default policy: tokenizer + tiny model, copy pre-training, reading on
    other worlds, then cold-start SFT on the scripted demonstrations of ``task`` (default
    "search_qa"; any env name that ``rllib_spear.envs.scripted_demonstrations`` knows).

    Cached under ``cache_dir`` (default ``$RLLIB_SPEAR_CACHE`` or ``~/.cache/rllib_spear``) by
    :func:`rllib_spear.coldstart.recipes.default_policy_key`. A build of the default recipe ships
    with the package (``rllib_spear/assets``, found by its manifest: a hash and a file read); it is
    copied into the cache unless ``build=True`` or ``$RLLIB_SPEAR_BUILD_DEFAULT_POLICY=1``, which
    build from scratch (~12 min on 2 idle cores, with progress on stderr)."""
    recipe = default_recipe(recipe, task)
    kind = "default-policy"
    root = _root(cache_dir)
    key = recipe_key(kind, recipe)
    found = _cached_or_shipped(root, kind, key, build)
    if found:
        return found
    _say(f"embedded default policy, recipe key {key}: "
         + ("build asked for" if _build_asked(build) else "no shipped or cached build")
         + "; replaying its demonstrations")
    convs, corpus = default_task_data(recipe)
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
        from rllib_spear.models.pretrain import copy_pretrain

        _say("stage 2/4: copy pre-training")
        start = Path(copy_pretrain(base, root, **recipe["copy_pretrain"]))
    return _reading_and_task_sft(start, reading, convs, recipe, root, (kind, key, trained_on), first_stage=3)


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
    by :func:`rllib_spear.coldstart.recipes.task_policy_key`); ``build=True`` or
    ``$RLLIB_SPEAR_BUILD_DEFAULT_POLICY=1`` build from scratch (multi_answer_search: ~9 min on 2
    cores)."""
    if task == "search_qa":
        return default_policy_path(cache_dir, build=build)
    recipe = task_recipe(task, recipe)
    kind = f"task-policy-{task}"
    root = _root(cache_dir)
    key = task_policy_key(task, recipe)
    found = _cached_or_shipped(root, kind, key, build)
    if found:
        return found
    start = default_policy_path(cache_dir, build=build)
    _say(f"{task} cold start, recipe key {key}: "
         + ("build asked for" if _build_asked(build) else "no shipped or cached build")
         + "; replaying its demonstrations")
    reading = reading_conversations(recipe, root)
    convs = task_conversations(recipe)
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
    from rllib_spear.models.sft import cold_start_sft  # torch: only when a build runs

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
    from rllib_spear.models.sft import cold_start_sft

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
