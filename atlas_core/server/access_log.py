"""The access log: one line per HTTP request on the ``atlas.access`` logger (level info), with
method, path, status, the request's prompt and completion tokens, and its time.

The middleware puts a `RequestUsage` in a context variable for the duration of the request; the
request's metrics tracker (`atlas_core.server.metrics.RequestTracker`) adds its token counts to it.
Prompt text is never logged here (``--log-requests`` logs it separately, see
`atlas_core.server.generation`).
"""

from __future__ import annotations

import logging
import time
from contextvars import ContextVar
from dataclasses import dataclass

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("atlas.access")


@dataclass
class RequestUsage:
    """Tokens of the engine requests one HTTP request made (several prompts add up)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0


_usage: ContextVar[RequestUsage | None] = ContextVar("atlas_request_usage", default=None)


def current_usage() -> RequestUsage | None:
    """The `RequestUsage` of the HTTP request being served, None outside one."""
    return _usage.get()


def access_log(app: ASGIApp) -> ASGIApp:
    """ASGI middleware: log ``"METHOD PATH" STATUS prompt_tokens=P completion_tokens=C T.TTTs``
    when each HTTP request ends (status 499 when no response was started: the client went away)."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP or not log.isEnabledFor(logging.INFO):
            await app(scope, receive, send)
            return
        usage, status, start = RequestUsage(), {"code": 499}, time.perf_counter()

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        token = _usage.set(usage)
        try:
            await app(scope, receive, recording_send)
        finally:
            _usage.reset(token)
            log.info(
                '"%s %s" %d prompt_tokens=%d completion_tokens=%d %.3fs',
                scope.get("method", ""),
                scope.get("path", ""),
                status["code"],
                usage.prompt_tokens,
                usage.completion_tokens,
                time.perf_counter() - start,
            )

    return middleware
