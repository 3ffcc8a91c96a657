"""Cold starts: the embedded policies that ``model_path: "embedded"`` / ``"embedded:<task>"`` name.

One job per module:

- ``recipes``: what shapes each build (``DEFAULT_POLICY_RECIPE``, ``TASK_POLICY_RECIPE``,
  ``TASK_POLICY_OVERRIDES``), its key (``default_policy_key``, ``task_policy_key``) and
  ``task_policy_env_config``;
- ``data``: what a build trains on, regenerated from ``rllib_spear.data`` and ``rllib_spear.envs``
  (demonstrations, corpus texts, reading conversations) and its ``data_hash``;
- ``build``: ``default_policy_path`` and ``task_policy_path``: the cache, the shipped build, or a
  build from scratch with progress on stderr;
- ``lookup``: shipped builds found by their manifest, and ``resolve_model_path``;
- ``ship``: ``python -m rllib_spear.coldstart`` rebuilds the builds and ships them into
  ``rllib_spear/assets``;
- ``smollm2``: the SmolLM2-135M-Instruct search cold start (``model_path: "smollm2-search"``),
  built on first use (``python -m rllib_spear.coldstart --smollm2``), never shipped, and
  ``smollm2_cold_start``, the cache-or-build step of every SmolLM2 cold start;
- ``tool_episodes``: synthetic tool-calling episodes (random tool schemas, a request, a Hermes
  call, its result, the answer), played on ``FunctionToolEnv``;
- ``smollm2_tools``: the SmolLM2 tool-use cold start trained on them (``model_path:
  "smollm2-tools"``, ``python -m rllib_spear.coldstart --smollm2-tools``), built on first use.

The generic training routines live in ``rllib_spear.models`` (``sft.cold_start_sft``,
``pretrain.copy_pretrain``, ``factory.build_tiny_model``); this package uses them, never the
reverse (docs/design.md, "The embedded default policy"). Imports are lazy, as in
``rllib_spear.models``.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "DEFAULT_POLICY_RECIPE": "recipes",
    "TASK_POLICY_RECIPE": "recipes",
    "TASK_POLICY_OVERRIDES": "recipes",
    "SHIPPED_TASKS": "recipes",
    "task_policy_env_config": "recipes",
    "default_policy_key": "recipes",
    "task_policy_key": "recipes",
    "recipe_key": "recipes",
    "reading_conversations": "data",
    "data_hash": "data",
    "default_policy_data_hash": "data",
    "task_policy_data_hash": "data",
    "default_policy_path": "build",
    "task_policy_path": "build",
    "SHIPPED_POLICIES": "lookup",
    "find_shipped": "lookup",
    "copy_shipped": "lookup",
    "is_embedded_name": "lookup",
    "resolve_model_path": "lookup",
    "NAMED_COLD_STARTS": "lookup",
    "SMOLLM2_SEARCH_NAME": "smollm2",
    "SMOLLM2_SEARCH_RECIPE": "smollm2",
    "smollm2_search_key": "smollm2",
    "smollm2_search_path": "smollm2",
    "smollm2_cold_start": "smollm2",
    "SMOLLM2_TOOLS_NAME": "smollm2_tools",
    "SMOLLM2_TOOLS_RECIPE": "smollm2_tools",
    "smollm2_tools_key": "smollm2_tools",
    "smollm2_tools_path": "smollm2_tools",
    "synthetic_tool_episodes": "tool_episodes",
    "ship_build": "ship",
    "ship_default_policy": "ship",
    "ship_task_policy": "ship",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'rllib_spear.coldstart' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
