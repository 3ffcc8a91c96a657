"""An env runner's OpenAI-compatible endpoint: a uvicorn server on the runner's agent loop.

:class:`OpenAIEndpoint` serves one engine (docs/design.md "The OpenAI endpoint"). ``start()``
binds a socket on ``host`` (``127.0.0.1`` unless told: only programs on the runner's machine reach
it) on a free port, draws the run's API key (``secrets.token_urlsafe``), and runs the FastAPI app
(serving/app.py) with uvicorn's ``Server.serve`` as a task of the process's agent loop
(env_runners/event_loop.py): every request awaits ``engine.agenerate`` on the loop the async
agent loop uses, so the engine batches the requests of all episodes together. ``stop()`` (the
runner's ``stop``) shuts the server down and closes the socket: no endpoint outlives its runner.

Episodes: ``open_episode`` registers an :class:`~rllib_spear.env_runners.serving.capture.EpisodeCapture`
under a random id and returns it with its base URL ``{url}/episodes/{id}/v1`` (what the episode's
``openai`` client is pointed at); ``close_episode`` ends it (its records returned, later calls 404).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import socket
import threading
import uuid
from typing import Any

from ..engines.base import SamplingConfig
from ..event_loop import agent_loop
from .capture import EpisodeCapture
from .chat import TOOL_MODES, ChatRenderer
from .protocol import SamplingPolicy
from .service import CompletionService

__all__ = ["OpenAIEndpoint", "SERVE_OPENAI_DEFAULTS", "check_serve_openai", "serve_openai_options",
           "start_runner_endpoint"]

log = logging.getLogger(__name__)

#: ``.env_runners(serve_openai=...)``: False (off), True (these defaults) or a dict of them.
SERVE_OPENAI_DEFAULTS: dict[str, Any] = {
    "host": "127.0.0.1",  # localhost: only programs on the runner's machine reach it
    "port": 0,  # 0: a free port (each runner its own)
    "model_name": "policy",  # what requests name as ``model``
    "tools": "hermes_system",  # a template that ignores tools gets the Hermes block (serving/chat.py)
}


def check_serve_openai(value: Any) -> list[str]:
    """The problems of a ``serve_openai`` value, each naming the key and the fix (empty: fine)."""
    if isinstance(value, bool):
        return []
    if not isinstance(value, dict):
        return [f"`serve_openai` must be True, False or a dict of {sorted(SERVE_OPENAI_DEFAULTS)} "
                f"(.env_runners(serve_openai=True)), got {value!r}"]
    out = [f"`serve_openai` key {k!r} is unknown; the keys are {sorted(SERVE_OPENAI_DEFAULTS)}"
           for k in value if k not in SERVE_OPENAI_DEFAULTS]
    port = value.get("port", 0)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
        out.append(f"`serve_openai['port']` must be 0 (a free port) or a port number, got {port!r}")
    for key in ("host", "model_name"):
        if key in value and (not isinstance(value[key], str) or not value[key]):
            out.append(f"`serve_openai[{key!r}]` must be a non-empty string, got {value[key]!r}")
    if value.get("tools", "hermes_system") not in TOOL_MODES:
        out.append(f"`serve_openai['tools']` must be one of {TOOL_MODES}, got {value.get('tools')!r}")
    return out


def serve_openai_options(value: Any) -> dict[str, Any] | None:
    """The endpoint's options of a ``serve_openai`` value (None: off)."""
    if not value:
        return None
    return {**SERVE_OPENAI_DEFAULTS, **(value if isinstance(value, dict) else {})}


class OpenAIEndpoint:
    """Serves ``engine`` over HTTP (see the module doc).

    Args:
        engine: the runner's engine (the watched one: ``generation_timeout_s`` applies).
        tokenizer: its tokenizer, with a chat template.
        sampling: the sampling of calls outside an episode (``/v1``); episodes bring their own.
        max_model_len, min_generation_tokens: the context budget of those calls.
        host, port, model_name, tools: :data:`SERVE_OPENAI_DEFAULTS`.
    """

    def __init__(self, engine: Any, tokenizer: Any, sampling: SamplingConfig, *, max_model_len: int = 1024,
                 min_generation_tokens: int = 8, host: str = "127.0.0.1", port: int = 0, model_name: str = "policy",
                 tools: str = "hermes_system") -> None:
        self.host, self._port, self.model_name = host, int(port), model_name
        self.api_key = secrets.token_urlsafe(32)
        policy = SamplingPolicy(sampling, max_model_len=int(max_model_len),
                                min_generation_tokens=int(min_generation_tokens))
        self.service = CompletionService(engine, ChatRenderer(tokenizer, tools), model_name, policy)
        self._episodes: dict[str, EpisodeCapture] = {}
        self._lock = threading.Lock()
        self._server: Any = None
        self._future: Any = None
        self._socket: socket.socket | None = None
        self._sync_http: Any = None  # the clients' shared connection pool (client())

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout_s: float = 30.0) -> "OpenAIEndpoint":
        """Bind, serve on the agent loop, return once the server accepts connections."""
        import uvicorn

        from .app import build_app

        if self._server is not None:
            return self
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self._port))
        sock.listen(1024)
        self._socket = sock
        self._port = sock.getsockname()[1]
        app = build_app(self.service, self.api_key, self.find_episode)
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=2, timeout_keep_alive=30)
        self._server = uvicorn.Server(config)
        self._future = asyncio.run_coroutine_threadsafe(self._server.serve(sockets=[sock]), agent_loop())
        started = threading.Event()

        async def wait_started() -> None:
            while not self._server.started and not self._future.done():
                await asyncio.sleep(0.005)
            started.set()

        asyncio.run_coroutine_threadsafe(wait_started(), agent_loop())
        if not started.wait(timeout_s) or not self._server.started:
            err = self._future.exception() if self._future.done() else None
            self.stop()
            raise RuntimeError(f"the OpenAI endpoint did not start on {self.host}:{self._port}: {err!r}")
        log.info("OpenAI endpoint serving %r on %s", self.model_name, self.url)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Shut the server down and close its socket (idempotent); open episodes end."""
        server, fut, self._server, self._future = self._server, self._future, None, None
        with self._lock:
            episodes, self._episodes = list(self._episodes.values()), {}
        for ep in episodes:
            ep.close()
        if server is not None:
            server.should_exit = True
            try:
                fut.result(timeout=timeout_s)
            except Exception:  # noqa: BLE001 - a server that did not stop in time is forced
                server.force_exit = True
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        sync_http, self._sync_http = self._sync_http, None
        if sync_http is not None:
            sync_http.close()

    @property
    def running(self) -> bool:
        return self._server is not None and self._server.started and not self._future.done()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self._port}"

    # ------------------------------------------------------------------ episodes
    def open_episode(self, policy: SamplingPolicy, *, seed: int | None = None, index: int = 0,
                     engine_gauge: Any = None) -> EpisodeCapture:
        """Register an episode; its calls go to :meth:`base_url` ``(capture)`` (serving/capture.py
        says what ``seed``, ``index`` and ``engine_gauge`` do)."""
        capture = EpisodeCapture(uuid.uuid4().hex, policy, seed=seed, index=index, engine_gauge=engine_gauge)
        with self._lock:
            self._episodes[capture.episode_id] = capture
        return capture

    def close_episode(self, capture: EpisodeCapture) -> list:
        """End an episode: later calls are 404s; returns its call records in arrival order."""
        with self._lock:
            self._episodes.pop(capture.episode_id, None)
        return capture.close()

    def find_episode(self, episode_id: str) -> EpisodeCapture | None:
        with self._lock:
            return self._episodes.get(episode_id)

    def base_url(self, capture: EpisodeCapture | None = None) -> str:
        """The ``base_url`` of an ``openai`` client for ``capture``'s calls (``/v1``: no episode)."""
        return f"{self.url}/v1" if capture is None else f"{self.url}/episodes/{capture.episode_id}/v1"

    def client_kwargs(self, capture: EpisodeCapture | None = None) -> dict[str, Any]:
        """``openai.OpenAI(**client_kwargs(capture))``: base URL, key, no retries (a refused request
        is the program's to see, not to repeat)."""
        return {"base_url": self.base_url(capture), "api_key": self.api_key, "max_retries": 0}

    def client(self, capture: EpisodeCapture | None = None, *, timeout: float | None = None) -> Any:
        """An ``openai.OpenAI`` for ``capture``'s calls (thread-safe). The clients share one HTTP
        connection pool, kept until :meth:`stop`: a client of its own costs ~0.1 s (its TLS
        context), more than a call; the pool ignores the environment's proxy settings (the
        endpoint is on this machine)."""
        import httpx
        import openai

        with self._lock:
            if self._sync_http is None:
                self._sync_http = httpx.Client(trust_env=False, limits=httpx.Limits(max_connections=None,
                                                                                     max_keepalive_connections=256))
        return openai.OpenAI(**self.client_kwargs(capture), timeout=timeout, http_client=self._sync_http)


def start_runner_endpoint(config: Any, engine: Any, tokenizer: Any, sampling: SamplingConfig,
                          required: bool) -> OpenAIEndpoint | None:
    """The env runner's endpoint, started: when ``config.serve_openai`` is set, or ``required``
    (a rollout mode whose episodes are agent programs); else None. It serves ``engine`` (the
    runner's watched engine), its ``/v1`` calls sampled with ``sampling`` (eos added) under the
    runner's ``max_model_len``."""
    options = serve_openai_options(config.serve_openai) or (dict(SERVE_OPENAI_DEFAULTS) if required else None)
    if options is None:
        return None
    eos = tokenizer.eos_token_id
    stops = [*sampling.stop_token_ids, *([] if eos is None or eos in sampling.stop_token_ids else [int(eos)])]
    return OpenAIEndpoint(engine, tokenizer, dataclasses.replace(sampling, stop_token_ids=stops),
                          max_model_len=int(config.max_model_len), **options).start()
