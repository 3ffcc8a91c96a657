"""The endpoint's request errors, in OpenAI's error body (what the ``openai`` client raises as
``BadRequestError``, ``AuthenticationError``, ``NotFoundError``...)."""
from __future__ import annotations

from typing import Any

__all__ = ["EndpointError", "error_body"]


class EndpointError(Exception):
    """A request the endpoint refuses: ``status`` (400 unless said), the message naming the field
    and the fix, OpenAI's ``param`` and ``code``."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.code = message, int(status), param, code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.status, self.param, self.code)


def error_body(message: str, status: int, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    kind = {401: "authentication_error", 404: "not_found_error"}.get(status, "invalid_request_error"
                                                                     if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
