"""Tool environments: search (BM25), multi-answer search, sandboxed code interpreter, text games.

Public API:

- ``make_env(spec, **env_config) -> ToolEnv``; ``spec`` is a name in :data:`ENV_NAMES`
  (``search_qa``, ``multi_answer_search``, ``code_math``, ``text_game``, ``textworld``), a name
  added with ``register_env(name, cls_or_factory)`` or ``ray.tune.register_env``, an import path
  ``"pkg.module:ClassName"`` or a :class:`ToolEnv` subclass (:mod:`rllib_spear.envs.registry`);
- ``FunctionToolEnv(tools=[fn, ...], reward_fn=None, ...)``: plain Python functions as tools
  (Hermes ``<tool_call>`` format, :mod:`rllib_spear.envs.function_tools`);
- ``load_tasks(source, split="train", env=None) -> list[dict]`` (default datasets, parquet,
  JSONL / JSON, the released layouts of docs/data_formats.md, a list of task dicts or a callable
  returning one);
- ``scripted_demonstrations(env_name, tasks, tool_use_rate=0.2, seed=0) -> list[conversation]``
  (built-in envs, by name or class);
- ``system_prompt(spec, **env_config)``: the instructions an env puts in its system message.

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
from rllib_spear.envs.registry import (ResolvedEnv, builtin_env_name, env_names, register_env, resolve_env,
                                       unregister_env)

__all__ = ["ToolEnv", "StepResult", "make_env", "load_tasks", "validate_tasks", "scripted_demonstrations",
           "system_prompt", "ENV_NAMES", "register_env", "unregister_env", "resolve_env", "env_names",
           "ResolvedEnv", "FunctionToolEnv"]

ENV_NAMES = ("search_qa", "multi_answer_search", "code_math", "text_game", "textworld")


def make_env(spec: Any, **env_config: Any) -> ToolEnv:
    """A new environment instance (one episode at a time; build one per concurrent episode).

    ``spec``: a built-in or registered name, a name registered with ``ray.tune.register_env``, an
    import path ``"pkg.module:ClassName"`` or a :class:`ToolEnv` subclass (see
    :mod:`rllib_spear.envs.registry`). Heavy shared resources (BM25 index, sandbox probe) are
    cached per process."""
    return resolve_env(spec).make(env_config)


def system_prompt(spec: Any, **env_config: Any) -> str:
    """The instructions the env of ``spec`` puts in its system message."""
    return make_env(spec, **env_config).system_prompt


def scripted_demonstrations(env_name: Any, tasks: list[dict], *, tool_use_rate: float = 0.2, seed: int = 0,
                            env_config: dict | None = None, think: str = "plain",
                            game_player: str = "solver") -> list[list[dict[str, str]]]:
    """Scripted demonstrations of a built-in env (given by name or class); other envs have no
    scripted policy (``ValueError``). ``think`` and ``game_player``: see
    :func:`rllib_spear.envs.demos.scripted_demonstrations`."""
    from rllib_spear.envs.demos import scripted_demonstrations as _sd

    name = builtin_env_name(env_name)
    if name is None:
        raise ValueError(f"no scripted policy for environment {resolve_env(env_name).label!r}: scripted "
                         f"demonstrations exist for the built-in envs {list(ENV_NAMES)} only")
    return _sd(name, tasks, tool_use_rate=tool_use_rate, seed=seed, env_config=env_config, think=think,
               game_player=game_player)


def __getattr__(name: str):
    if name == "FunctionToolEnv":
        from rllib_spear.envs.function_tools import FunctionToolEnv

        return FunctionToolEnv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
