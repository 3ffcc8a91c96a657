"""What shapes each cold-start build, and the build's name (its key).

The recipes are plain constants; ``recipe_key`` hashes a recipe with the embedded data and
demonstration versions, so a key is computed from the repository alone (no data replay, the
same on every machine). A shipped build is found by this key (``coldstart.lookup``); do not
change a recipe without re-shipping (``python -m rllib_spear.coldstart``).
"""
from __future__ import annotations

import hashlib
import json

__all__ = ["DEFAULT_POLICY_RECIPE", "TASK_POLICY_RECIPE", "TASK_POLICY_OVERRIDES", "SHIPPED_TASKS",
           "task_policy_env_config", "default_recipe", "task_recipe", "recipe_key", "versions",
           "default_policy_key", "task_policy_key"]

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
    # text_game: every demonstration explores the game the way its observations allow (open what
    # is closed, visit unvisited rooms, take the goal object when it shows, carry it to the goal
    # receptacle's room), thinking the phase in the goal's words ("I look for the sock."). The
    # solver's plans walk straight to the hidden object, so imitating them taught no policy where
    # to look (0 wins in 128 games); with half of the demonstrations random (3 actions, "I will
    # try ...") the policy mixed the two and won 0 of 6 greedy games. 8 turns, the learning
    # benchmark's episode: the explorer wins 210 of the 244 train games (mean 5.5 actions).
    "text_game": dict(
        tool_use_rate=1.0, game_player="explorer", env_config={"max_turns": 8},
        sft=dict(epochs=4, lr=1e-3, seed=0, max_len=1536, batch_size=16),
    ),
}

#: Task cold starts that ship with the package (``python -m rllib_spear.coldstart`` rebuilds them).
SHIPPED_TASKS = ("multi_answer_search",)


def task_policy_env_config(task: str) -> dict:
    """The env_config a task cold start (``task_policy_path``) was trained with; run RL on the task
    with it (e.g. ``config.environment("multi_answer_search", env_config=task_policy_env_config(
    "multi_answer_search"))``), since the policy only knows that call format."""
    return dict(TASK_POLICY_OVERRIDES.get(task, {}).get("env_config") or {})


def default_recipe(recipe: dict | None = None, task: str | None = None) -> dict:
    """``recipe`` (default ``DEFAULT_POLICY_RECIPE``), with its task replaced by ``task`` if given."""
    recipe = dict(DEFAULT_POLICY_RECIPE if recipe is None else recipe)
    if task is not None:
        recipe["task"] = task
    return recipe


def task_recipe(task: str, recipe: dict | None = None) -> dict:
    """``recipe`` (default ``TASK_POLICY_RECIPE`` updated with ``TASK_POLICY_OVERRIDES[task]``)
    for ``task``."""
    if recipe is None:
        recipe = {**TASK_POLICY_RECIPE, **TASK_POLICY_OVERRIDES.get(task, {})}
    return {**recipe, "task": task}


def versions() -> dict[str, str]:
    """What the embedded data and demonstrations are versioned by (imported lazily: computing a
    key needs only these two constants)."""
    from rllib_spear.data.generate import DATA_VERSION
    from rllib_spear.envs.demos import DEMOS_VERSION

    return {"data_version": DATA_VERSION, "demos_version": str(DEMOS_VERSION)}


def recipe_key(kind: str, recipe: dict, parent_key: str | None = None) -> str:
    """sha256[:16] of (kind, recipe, data version, demonstrations version, parent key): the name of
    a build of ``recipe``. Pure: the same on every machine for the same repository."""
    payload = {"kind": kind, "recipe": recipe, "parent": parent_key, **versions()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def default_policy_key(recipe: dict | None = None, *, task: str | None = None) -> str:
    """The name of a default-policy build: :func:`recipe_key` of the recipe and the
    data/demonstration versions. Cheap and machine-independent (no data replay)."""
    return recipe_key("default-policy", default_recipe(recipe, task))


def task_policy_key(task: str, recipe: dict | None = None) -> str:
    """The name of a task cold-start build: :func:`recipe_key` of its recipe, the
    data/demonstration versions and the default policy's key (cheap, no data replay)."""
    return recipe_key(f"task-policy-{task}", task_recipe(task, recipe), default_policy_key())
