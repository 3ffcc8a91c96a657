"""Tool environments: search (BM25), multi-answer search, sandboxed code interpreter, text games.

Public API:

- ``make_env(name, **env_config) -> ToolEnv`` with ``name`` in :data:`ENV_NAMES`
  (``search_qa``, ``multi_answer_search``, ``code_math``, ``text_game``, ``textworld``);
- ``load_tasks(name_or_path, split="train") -> list[dict]`` (default datasets or parquet);
- ``scripted_demonstrations(env_name, tasks, tool_use_rate=0.2, seed=0) -> list[conversation]``;
- ``system_prompt(name, **env_config)``: the instructions an env puts in its system message.

Main ``env_config`` keys: ``parser`` (search envs: ``search_r1`` | ``spader`` | ``hermes``; code:
``code`` | ``hermes``), ``max_turns``, ``top_k``, ``max_chars`` (budget of one search call),
``result_format`` (``text`` | ``json``), ``corpus_path`` (parquet ``id,title,text``; default the
embedded fictional corpus), ``retriever_url`` (Search-R1 ``/retrieve`` server instead of BM25),
``reward`` (search_qa: ``em`` | ``f1``), ``format_error_reward`` / ``final_weight`` /
``entity_match`` (multi_answer_search), ``sandbox_config`` / ``stateful`` (code_math),
``success_reward`` / ``invalid_action_penalty`` (games). See each env class for the rest.
"""
from __future__ import annotations

from typing import Any

from rllib_spear.envs.base import StepResult, ToolEnv
from rllib_spear.envs.loaders import load_tasks, validate_tasks

__all__ = ["ToolEnv", "StepResult", "make_env", "load_tasks", "validate_tasks", "scripted_demonstrations",
           "system_prompt", "ENV_NAMES"]

ENV_NAMES = ("search_qa", "multi_answer_search", "code_math", "text_game", "textworld")


def _env_class(name: str):
    if name == "search_qa":
        from rllib_spear.envs.search_envs import SearchQAEnv as C
    elif name in ("multi_answer_search", "multi_answer"):
        from rllib_spear.envs.search_envs import MultiAnswerSearchEnv as C
    elif name == "code_math":
        from rllib_spear.envs.code_math import CodeMathEnv as C
    elif name == "text_game":
        from rllib_spear.envs.text_game import TextGameEnv as C
    elif name == "textworld":
        from rllib_spear.envs.textworld_env import TextWorldEnv as C
    else:
        raise ValueError(f"unknown environment {name!r}; choose from {list(ENV_NAMES)}")
    return C


def make_env(name: str, **env_config: Any) -> ToolEnv:
    """A new environment instance (one episode at a time; build one per concurrent episode).
    Heavy shared resources (BM25 index, sandbox probe) are cached per process."""
    cls = _env_class(name)
    try:
        return cls(**env_config)
    except TypeError as e:
        raise ValueError(f"make_env({name!r}): bad env_config {sorted(env_config)}: {e}") from e


def system_prompt(name: str, **env_config: Any) -> str:
    return make_env(name, **env_config).system_prompt


def scripted_demonstrations(env_name: str, tasks: list[dict], *, tool_use_rate: float = 0.2, seed: int = 0,
                            env_config: dict | None = None, think: str = "plain") -> list[list[dict[str, str]]]:
    from rllib_spear.envs.demos import scripted_demonstrations as _sd

    return _sd(env_name, tasks, tool_use_rate=tool_use_rate, seed=seed, env_config=env_config, think=think)
