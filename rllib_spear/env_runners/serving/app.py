"""The endpoint's HTTP layer (FastAPI): routes, the API key, and errors in OpenAI's body.

Routes, each under ``/v1`` (calls of no episode: served, never recorded) and under
``/episodes/<episode id>/v1`` (an episode's calls: recorded for training; the id is that of an
open episode, else 404):

* ``POST .../chat/completions``, ``POST .../completions`` (serving/service.py);
* ``GET .../models``: the one served model.

Every route needs ``Authorization: Bearer <key>`` (the ``openai`` client's ``api_key``); a missing
or wrong key is a 401 (compared in constant time). A body that is not JSON, and every request the
endpoint cannot honour, is a 400 naming the parameter; an engine failure a 500 with its message;
nothing a request sends ends the server.
"""
import hmac
import logging
from typing import Any, Awaitable, Callable, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .errors import EndpointError, error_body

# (no ``from __future__ import annotations``: FastAPI reads the routes' annotations as types)

__all__ = ["build_app"]

log = logging.getLogger(__name__)


def build_app(service: Any, api_key: str, find_episode: Callable[[str], Any]) -> Any:
    """The FastAPI app over ``service`` (a ``CompletionService``); ``find_episode(id)`` is the
    open episode's ``EpisodeCapture`` or None."""
    app = FastAPI(title="rllib_spear policy endpoint", docs_url=None, redoc_url=None, openapi_url=None)
    expected = f"Bearer {api_key}".encode()

    def refuse(exc: EndpointError) -> JSONResponse:
        service.refused += 1
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(exc.detail), exc.status_code), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return refuse(EndpointError(f"malformed request: {exc.errors()}"))

    async def handle(request: Request, episode_id: Optional[str],
                     op: Optional[Callable[[Any, Any], Awaitable[dict[str, Any]]]]) -> JSONResponse:
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            return JSONResponse(error_body("missing or wrong API key: pass the key the episode's client was given "
                                           "(Authorization: Bearer <key>)", 401, code="invalid_api_key"),
                                status_code=401)
        episode = None
        if episode_id is not None:
            episode = find_episode(episode_id)
            if episode is None:
                return refuse(EndpointError(f"no open episode {episode_id!r} (it ended, or never existed)",
                                            status=404, code="episode_not_found"))
        if op is None:
            return JSONResponse(service.models())
        try:
            body = await request.json()
        except Exception:  # noqa: BLE001 - any undecodable body
            return refuse(EndpointError("the request body is not valid JSON"))
        try:
            return JSONResponse(await op(body, episode))
        except EndpointError as exc:
            return refuse(exc)
        except Exception as exc:  # noqa: BLE001 - the engine failed (a timeout, a dead engine): this call only
            log.warning("endpoint: %s failed: %s: %s", request.url.path, type(exc).__name__, exc)
            return JSONResponse(error_body(f"the engine failed: {type(exc).__name__}: {exc}", 500), status_code=500)

    for prefix, with_episode in (("/v1", False), ("/episodes/{episode_id}/v1", True)):
        def routes(with_episode: bool = with_episode) -> tuple:
            async def chat(request: Request, episode_id: Optional[str] = None) -> JSONResponse:
                return await handle(request, episode_id if with_episode else None, service.chat)

            async def complete(request: Request, episode_id: Optional[str] = None) -> JSONResponse:
                return await handle(request, episode_id if with_episode else None, service.complete)

            async def models(request: Request, episode_id: Optional[str] = None) -> JSONResponse:
                return await handle(request, episode_id if with_episode else None, None)

            return chat, complete, models

        chat, complete, models = routes()
        app.add_api_route(f"{prefix}/chat/completions", chat, methods=["POST"])
        app.add_api_route(f"{prefix}/completions", complete, methods=["POST"])
        app.add_api_route(f"{prefix}/models", models, methods=["GET"])
    return app
