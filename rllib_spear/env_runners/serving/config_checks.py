"""``GRPOConfig.validate()``'s checks of the endpoint and of agent-program runs, each naming the key
and the fix: ``serve_openai``'s value, an ``AgentProgramEnv`` under a rollout mode that serves
the endpoint (``"agent_program"``) and the reverse, a program given, and the sample layout (the
calls choose it: ``step_context`` stays ``"full"``), and the packages it needs installed."""
from __future__ import annotations

import importlib.util
from typing import Any

from .endpoint import check_serve_openai

__all__ = ["serving_config_problems", "SERVING_PACKAGES"]

#: What the endpoint and the programs' clients import (the ``serve`` extra of setup.cfg).
SERVING_PACKAGES = ("fastapi", "uvicorn", "httpx", "openai")


def serving_config_problems(config: Any) -> list[str]:
    """The problems of ``config``'s endpoint and agent-program settings (empty: fine)."""
    from ..rollout_modes import AUTO, ROLLOUT_MODES
    from ...envs.agent_program import AgentProgramEnv
    from ...envs.registry import resolve_env

    out = check_serve_openai(config.serve_openai)
    port = config.serve_openai.get("port", 0) if isinstance(config.serve_openai, dict) else 0
    if port and (config.num_env_runners or 0) > 1:
        out.append(f"`serve_openai['port']` {port} with num_env_runners={config.num_env_runners}: the runners of one "
                   "node would bind the same port; leave port 0 (each runner a free port of its own)")
    if config.rollout_mode != AUTO and config.rollout_mode not in ROLLOUT_MODES:
        return out  # validate()'s rollout_mode check names it
    mode = config.effective_rollout_mode
    serves = ROLLOUT_MODES.get(mode).serves_openai
    missing = [m for m in SERVING_PACKAGES if importlib.util.find_spec(m) is None]
    if (serves or config.serve_openai) and missing:
        out.append(f"the OpenAI endpoint (serve_openai / rollout_mode={mode!r}) needs {missing}: "
                   "pip install 'rllib-spear[serve]'")
    try:
        cls = resolve_env(config.env).env_cls
    except Exception:  # noqa: BLE001 - an unresolvable env is validate()'s `env` check
        cls = None
    is_program = cls is not None and issubclass(cls, AgentProgramEnv)
    if is_program and not serves:
        out.append(f"`env` {config.env!r} runs an agent program against the runner's OpenAI endpoint: set "
                   ".env_runners(rollout_mode='agent_program') (or leave rollout_mode 'auto')")
    if serves and cls is not None and not is_program:
        out.append(f"`rollout_mode` {mode!r} runs agent programs (an AgentProgramEnv), not "
                   f"{cls.__name__}: use .environment('agent_program', env_config={{'program': ...}}), or another "
                   "rollout_mode")
    if is_program and not (config.env_config or {}).get("program"):
        out.append("`env_config['program']` is required by the agent_program environment: "
                   ".environment('agent_program', env_config={'program': my_agent}) (a function (task, client) -> "
                   "reward, or 'pkg.module:function')")
    if serves and config.step_context != "full":
        out.append(f"`step_context` {config.step_context!r}: with rollout_mode={mode!r} the calls choose "
                   "the layout (one context when they chain, one sample per call otherwise); leave it 'full'")
    return out
