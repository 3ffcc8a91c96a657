"""What a cold-start build trains on, regenerated from the embedded data and environments.

The task's scripted demonstrations (``rllib_spear.envs.scripted_demonstrations``), the corpus
texts its tokenizer is trained on (``rllib_spear.data``), and the reading conversations: search
demonstrations on other fictional worlds (``rllib_spear.data.generate``). ``data_hash`` of them is
recorded in a shipped build's manifest; the ``*_data_hash`` functions regenerate it to check that
a shipped build is fresh (``tests/models/test_default_policy.py``).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from rllib_spear.cache_paths import cache_root

from .recipes import default_recipe, task_recipe

__all__ = ["task_conversations", "reading_conversations", "default_task_data", "data_hash",
           "default_policy_data_hash", "task_policy_data_hash"]

logger = logging.getLogger(__name__)


def data_hash(*parts: Any) -> str:
    """sha256[:16] of the JSON of every part (conversations, corpus texts...) a build trains on."""
    h = hashlib.sha256()
    for part in parts:
        h.update(json.dumps(part, sort_keys=True).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def task_conversations(recipe: dict) -> list[list[dict]]:
    """The scripted demonstrations of ``recipe["task"]``: ``recipe["demo_passes"]`` passes over the
    task's training tasks with different scripted choices."""
    import rllib_spear.envs as envs

    tasks = envs.load_tasks(recipe["task"])
    # Several passes over the tasks with different scripted choices: the same questions are
    # seen both answered directly and answered after a search.
    convs = []
    for k in range(int(recipe.get("demo_passes", 1))):
        convs += envs.scripted_demonstrations(
            recipe["task"], tasks, tool_use_rate=recipe["tool_use_rate"], seed=recipe["demo_seed"] + k,
            think=recipe.get("think", "plain"), env_config=recipe.get("env_config"),
            game_player=recipe.get("game_player", "solver"),
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
    folder = Path(root) / "reading-worlds"
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


def default_task_data(recipe: dict) -> tuple[list[list[dict]], list[str]]:
    """(demonstration conversations, corpus texts) of the embedded task."""
    convs = task_conversations(recipe)
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


def _root(cache_dir: str | os.PathLike | None) -> Path:
    return Path(cache_dir) if cache_dir is not None else cache_root()


def default_policy_data_hash(recipe: dict | None = None, cache_dir: str | os.PathLike | None = None, *,
                             task: str | None = None) -> str:
    """:func:`data_hash` of everything a default-policy build trains on (the task's
    demonstrations, the corpus texts of its tokenizer, the reading conversations), regenerated
    now: compare with a shipped build's ``manifest.json`` to see if it is fresh."""
    recipe = default_recipe(recipe, task)
    convs, corpus = default_task_data(recipe)
    return data_hash(convs, corpus, reading_conversations(recipe, _root(cache_dir)))


def task_policy_data_hash(task: str, recipe: dict | None = None, cache_dir: str | os.PathLike | None = None) -> str:
    """:func:`data_hash` of what a task cold start trains on (its reading conversations and task
    demonstrations), regenerated now (see ``default_policy_data_hash``)."""
    recipe = task_recipe(task, recipe)
    return data_hash(reading_conversations(recipe, _root(cache_dir)), task_conversations(recipe))
