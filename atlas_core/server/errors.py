"""HTTP errors in the shape each API's clients expect.

Every failure becomes an `APIError` (status, message, error type, offending parameter). It is
written OpenAI-shaped (``{"error": {"message", "type", "param", "code"}}``) everywhere except under
``/v1/messages``, where it is Anthropic-shaped (``{"type": "error", "error": {"type", "message"}}``).
Unexpected exceptions are logged and answered with a 500 of the same shape; the server keeps serving.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, InternalServerException, ValidationException

from atlas_core.errors import AtlasError, InvalidRequestError

log = logging.getLogger("atlas.server")

ANTHROPIC_PREFIX = "/v1/messages"

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    504: "timeout_error",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


class APIError(Exception):
    """A request that cannot be served: ``status`` (HTTP), a ``message`` saying what to change,
    the request field at fault (``param``) and an OpenAI error ``code`` where one exists."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


CLIENT_CLOSED = 499
"""Status recorded (in the request metrics) for a request whose client hung up before its response."""


def invalid(message: str, param: str | None = None) -> APIError:
    """A 400 about the request's content."""
    return APIError(400, message, param=param)


class OpenAIErrorBody(msgspec.Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIError(msgspec.Struct):
    """OpenAI's error response."""

    error: OpenAIErrorBody


class AnthropicErrorBody(msgspec.Struct):
    type: str
    message: str


class AnthropicError(msgspec.Struct, tag_field="type", tag="error"):
    """Anthropic's error response (also the payload of a streamed ``error`` event)."""

    error: AnthropicErrorBody


def is_anthropic_path(path: str) -> bool:
    """True for the Anthropic routes (``/v1/messages`` and below), whose errors are Anthropic-shaped."""
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


def openai_error(error: APIError) -> OpenAIError:
    """``error`` in OpenAI's shape; the ``type`` follows from the status."""
    kind = _OPENAI_TYPES.get(error.status, "server_error" if error.status >= 500 else "invalid_request_error")
    return OpenAIError(OpenAIErrorBody(error.message, kind, error.param, error.code))


def anthropic_error(error: APIError) -> AnthropicError:
    """``error`` in Anthropic's shape; the ``type`` follows from the status."""
    kind = _ANTHROPIC_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    return AnthropicError(AnthropicErrorBody(kind, error.message))


def error_payload(path: str, error: APIError) -> OpenAIError | AnthropicError:
    """``error`` in the shape of the API that ``path`` belongs to."""
    return anthropic_error(error) if is_anthropic_path(path) else openai_error(error)


def as_api_error(exc: Exception) -> APIError:
    """Translate any exception raised while serving into an `APIError`."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, InvalidRequestError):
        return APIError(400, str(exc))
    if isinstance(exc, ValidationException):
        return APIError(400, _validation_message(exc), param=_first_key(exc))
    if isinstance(exc, InternalServerException) and "disconnected" in str(exc.detail):  # while sending the body
        return APIError(CLIENT_CLOSED, "the client closed the connection before it had sent the request body")
    if isinstance(exc, HTTPException):
        return APIError(exc.status_code, _http_message(exc))
    if isinstance(exc, AtlasError):
        return APIError(500, str(exc))
    if isinstance(exc, UnicodeError):  # decoding the body
        return APIError(400, f"the request body is not valid Unicode ({exc}); send JSON encoded as UTF-8")
    if isinstance(exc, RecursionError):  # decoding the body, or walking a JSON Schema in it
        return APIError(
            400,
            "the request is nested too deeply to process (objects and arrays, or a JSON Schema, nested hundreds "
            "of levels); nest it less deeply",
        )
    log.exception("unexpected error while serving a request", exc_info=exc)
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}")


EMPTY_BODY = "'data'"
"""Litestar's validation message for a route's missing ``data`` (an empty request body)."""


def _validation_message(exc: ValidationException) -> str:
    problems = exc.extra if isinstance(exc.extra, list) else []
    parts = []
    for problem in problems:
        if isinstance(problem, dict):
            key = problem.get("key")
            text = str(problem.get("message", "invalid value"))
            if key == "data" and text == EMPTY_BODY:
                return "the request body is empty: send a JSON object (Content-Type: application/json)"
            parts.append(f"`{key}`: {text}" if key and key != "data" else text)
    return "invalid request body: " + ("; ".join(parts) if parts else str(exc.detail))


def _first_key(exc: ValidationException) -> str | None:
    problems = exc.extra if isinstance(exc.extra, list) else []
    for problem in problems:
        if isinstance(problem, dict) and isinstance(problem.get("key"), str) and problem["key"] != "data":
            return problem["key"]
    return None


def _http_message(exc: HTTPException) -> str:
    detail = str(exc.detail)
    if exc.status_code == 400:  # Litestar's own 400s come from decoding the body
        return f"the request body is not valid JSON: {detail}"
    if exc.status_code == 404:
        return f"not found: {detail}; see /openapi.json for the endpoints"
    if exc.status_code == 413:
        return "the request body is larger than the server accepts (--max-body-bytes)"
    return detail


def handle_exception(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """Litestar exception handler for every exception type."""
    error = as_api_error(exc)
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
    return Response(error_payload(request.url.path, error), status_code=error.status, headers=headers)
