"""The env runner's OpenAI-compatible endpoint (docs/design.md "The OpenAI endpoint").

``.env_runners(serve_openai=True)``: each env runner serves its engine on ``/v1/chat/completions``
and ``/v1/completions`` (localhost, a per-run API key), and records every call an episode makes
through its own base URL, ``/episodes/<id>/v1``, with the exact prompt and completion token ids,
log-probs and weights version, so that an agent program (``AgentProgramEnv``,
rllib_spear/envs/agent_program.py) trains on what the policy sampled.

Modules: chat.py (messages <-> token ids, tool calls), protocol.py (what a request may ask),
capture.py (an episode's calls and continuation), service.py (one request to the engine),
app.py (HTTP: FastAPI routes, the key, errors), endpoint.py (the uvicorn server's lifecycle).
FastAPI and uvicorn are imported only when an endpoint starts.
"""
from __future__ import annotations

from .endpoint import (SERVE_OPENAI_DEFAULTS, OpenAIEndpoint, check_serve_openai, serve_openai_options,
                       start_runner_endpoint)

__all__ = ["OpenAIEndpoint", "SERVE_OPENAI_DEFAULTS", "check_serve_openai", "serve_openai_options",
           "start_runner_endpoint"]
