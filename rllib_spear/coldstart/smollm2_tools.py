"""A tool-use cold start of SmolLM2-135M-Instruct: ``model_path: "smollm2-tools"``.

SmolLM2-135M-Instruct itself (``"smollm2-instruct"``) answers a ``FunctionToolEnv``'s request in
prose: it never writes a ``<tool_call>``, so every response of a new environment is masked as
``incomplete`` and GRPO has nothing to train on. This cold start fine-tunes it
(``models.sft.cold_start_sft``, a full fine-tune with the loss on assistant tokens, as
``coldstart.smollm2``'s search cold start) on synthetic tool-calling episodes
(``coldstart.tool_episodes``): random tools presented the way ``FunctionToolEnv`` presents them,
a request, the Hermes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, the
``<tool_response>`` observation and the ``<answer>``. It learns the format and to read a new
tool's schema, not any particular tool: the start for a user's own environment.

Nothing is shipped (the folder is ~540 MB in float32): the first call builds it (progress on
stderr, ``SMOLLM2_TOOLS_BUILD_MINUTES`` on 2 cores), later calls find it in the cache. Its
cache record ``<cache>/smollm2-tools-<key>.json`` is keyed by :func:`smollm2_tools_key` (the
recipe, the generator's ``TOOL_EPISODES_VERSION``, the data / demonstration versions and the base
model's hash) and records the :func:`~rllib_spear.coldstart.data.data_hash` of the episodes it
trained on; a record whose data hash differs from the episodes generated now is rebuilt.

    python -m rllib_spear.coldstart --smollm2-tools     # build it (or print the cached folder)
"""
from __future__ import annotations

import os

from .recipes import recipe_key
from .smollm2 import smollm2_base_hash, smollm2_cold_start

__all__ = ["SMOLLM2_TOOLS_NAME", "SMOLLM2_TOOLS_RECIPE", "SMOLLM2_TOOLS_BUILD_MINUTES", "smollm2_tools_key",
           "smollm2_tools_conversations", "smollm2_tools_path"]

#: The ``model_path`` that names this cold start (``coldstart.lookup.resolve_model_path``).
SMOLLM2_TOOLS_NAME = "smollm2-tools"

#: Everything that shapes the build besides the base model and the generator; part of its key.
SMOLLM2_TOOLS_RECIPE = dict(
    episodes=160,  # synthetic episodes of the train split (coldstart.tool_episodes)
    seed=0,
    max_tools=3,  # tools in a prompt: the episode's own and distractors
    custom_prompt_rate=0.25,
    sft=dict(epochs=1, lr=2e-4, seed=0, max_len=1024, batch_size=4, warmup_frac=0.1, weight_decay=0.0),
    v=1,
)

#: Wall time of a build of the default recipe on 2 CPU cores: 40 SFT steps. Measured 2026-12-05 on a
#: fresh clone with an empty cache, 2 quiet cores: 530 s (the README snippet's first run; the
#: weights were bitwise those of an earlier build that took 44 min on cores shared with other jobs).
SMOLLM2_TOOLS_BUILD_MINUTES = 10
# Measured on this recipe (benchmarks/smollm2_tools_coldstart.py, temperature 1, 64 new tokens a
# turn): tool-call rate 0.729 / answer rate 0.979 / success 0.479 on 48 episodes of held-out
# synthetic tools; 0.917 / 1.000 / 0.604 on a calculator (add, multiply, subtract); 1.000 /
# 1.000 / 0.667 on the README's city facts. SmolLM2-135M-Instruct itself: 0 / 0 / 0 on all three
# (prose, never a <tool_call>).


def _recipe(recipe: dict | None) -> dict:
    recipe = dict(SMOLLM2_TOOLS_RECIPE if recipe is None else recipe)
    for name in ("episodes", "seed", "max_tools", "sft"):
        if name not in recipe:
            raise ValueError(f"smollm2-tools recipe: missing {name!r}; start from SMOLLM2_TOOLS_RECIPE")
    if int(recipe["episodes"]) < 1:
        raise ValueError(f"smollm2-tools recipe: episodes must be >= 1, got {recipe['episodes']}")
    return recipe


def smollm2_tools_key(recipe: dict | None = None, base_hash: str | None = None) -> str:
    """The name of a build: :func:`~rllib_spear.coldstart.recipes.recipe_key` of the recipe with
    the generator's version, the data / demonstration versions and ``base_hash`` (default:
    :func:`~rllib_spear.coldstart.smollm2.smollm2_base_hash`)."""
    from .tool_episodes import TOOL_EPISODES_VERSION

    keyed = {**_recipe(recipe), "tool_episodes_version": TOOL_EPISODES_VERSION}
    return recipe_key(SMOLLM2_TOOLS_NAME, keyed, smollm2_base_hash() if base_hash is None else base_hash)


def smollm2_tools_conversations(recipe: dict | None = None) -> list[list[dict]]:
    """The recipe's synthetic tool-calling episodes (train split) as chat conversations."""
    from .tool_episodes import synthetic_tool_episodes

    recipe = _recipe(recipe)
    episodes = synthetic_tool_episodes(int(recipe["episodes"]), seed=int(recipe["seed"]), split="train",
                                       max_tools=int(recipe["max_tools"]),
                                       custom_prompt_rate=float(recipe.get("custom_prompt_rate", 0.25)))
    return [ep.conversation for ep in episodes]


def smollm2_tools_path(cache_dir: str | os.PathLike | None = None, *, recipe: dict | None = None,
                       base: str | os.PathLike | None = None, build: bool = False) -> str:
    """The SmolLM2 tool-use cold start's folder: cached, else built now (module docstring).

    ``base``: the model folder to fine-tune (default: the packaged SmolLM2-135M-Instruct; tests
    pass a tiny model). ``build=True`` rebuilds even when a record of the same key and data
    exists (the SFT itself is cached by its inputs)."""
    recipe = _recipe(recipe)
    key = smollm2_tools_key(recipe, smollm2_base_hash(base))
    convs = smollm2_tools_conversations(recipe)
    return smollm2_cold_start(SMOLLM2_TOOLS_NAME, key, convs, recipe["sft"], cache_dir=cache_dir, base=base,
                              build=build, what="tool-use cold start (synthetic tool-calling episodes)",
                              minutes=SMOLLM2_TOOLS_BUILD_MINUTES)
