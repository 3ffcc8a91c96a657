"""rllib_spear: SPEAR and SPADER for tool-using LLM agents, as a Ray RLlib plugin.

Importing the package registers "SPEAR", "SPADER", "DrBoT" and "GRPO-LLM" with Tune. The numeric
core (``rllib_spear.core``) has no Ray dependency.
"""
__version__ = "0.1.0"


def _is_cli_process() -> bool:
    """Whether this process runs the ``rllib-spear`` command (the console script, or ``python -m
    rllib_spear.cli``). The command registers the algorithms itself when a subcommand needs Ray
    (``rllib_spear.cli._load_plugin``), so that ``--help`` and ``--version`` answer without
    importing Ray and torch (seconds)."""
    import os
    import sys

    if sys.argv and os.path.basename(sys.argv[0]).removesuffix(".exe") == "rllib-spear":
        return True
    argv = list(getattr(sys, "orig_argv", ()))  # with -m, sys.argv[0] is "-m" while the package imports
    return any(a == "-m" and b == "rllib_spear.cli" for a, b in zip(argv, argv[1:]))


def _register() -> None:
    import os

    if os.environ.get("RLLIB_SPEAR_NO_REGISTER") == "1" or _is_cli_process():
        return
    try:
        from .registration import register_all
    except ImportError:  # ray not installed: core/ still usable
        return
    register_all()


_register()


def __getattr__(name: str):
    lazy = {
        "GRPOConfig": ("algorithms.grpo", "GRPOConfig"), "GRPO": ("algorithms.grpo", "GRPO"),
        "DrBoTConfig": ("algorithms.grpo", "DrBoTConfig"), "DrBoT": ("algorithms.grpo", "DrBoT"),
        "SPEARConfig": ("algorithms.spear.config", "SPEARConfig"),
        "SPEAR": ("algorithms.spear.spear", "SPEAR"),
        "SPADERConfig": ("algorithms.spader.config", "SPADERConfig"),
        "SPADER": ("algorithms.spader.spader", "SPADER"),
        # your own tool environments (rllib_spear/envs/registry.py)
        "register_env": ("envs.registry", "register_env"),
        "FunctionToolEnv": ("envs.function_tools", "FunctionToolEnv"),
        # the embedded cold starts (rllib_spear.coldstart)
        "resolve_model_path": ("coldstart", "resolve_model_path"),
        "default_policy_path": ("coldstart", "default_policy_path"),
        "task_policy_path": ("coldstart", "task_policy_path"),
        "task_policy_env_config": ("coldstart", "task_policy_env_config"),
    }
    if name in lazy:
        import importlib

        mod, attr = lazy[name]
        return getattr(importlib.import_module(f".{mod}", __name__), attr)
    raise AttributeError(name)
