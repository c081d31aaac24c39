"""The Litestar application: OpenAI and Anthropic routes over one `ServerState`.

`create_app` wires the routes (the chat page at ``/`` unless ``web_ui`` is off), API-key guard,
CORS, body-size limit, error shapes, request metrics and the OpenAPI document (``/openapi.json``;
Litestar's viewers under ``/schema``). The caller owns the engine; on application shutdown the
state drains it (see `ServerState.drain`).
"""

from __future__ import annotations

from typing import Any

from litestar import Litestar, Router
from litestar.config.cors import CORSConfig
from litestar.di import Provide
from litestar.enums import ScopeType
from litestar.middleware import DefineMiddleware
from litestar.openapi import OpenAPIConfig
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from atlas_core.server import routes_anthropic, routes_embeddings, routes_misc, routes_openai, routes_responses
from atlas_core.server.access_log import access_log
from atlas_core.server.auth import api_key_guard
from atlas_core.server.errors import handle_exception
from atlas_core.server.metrics import ServerMetrics, route_label
from atlas_core.server.routes_web import web_routes
from atlas_core.server.state import ServerState
from atlas_core.version import __version__


def _count_requests(app: ASGIApp, metrics: ServerMetrics) -> ASGIApp:
    """ASGI middleware: ``atlas_http_requests_total{route, method, status, model_name}``."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        status = {"code": 500}

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await app(scope, receive, recording_send)
        finally:
            metrics.count_http(route_label(scope), scope.get("method", ""), status["code"])  # type: ignore[arg-type]

    return middleware


def create_app(state: ServerState) -> Litestar:
    """The HTTP application serving ``state`` (whose model may still be loading)."""
    config = state.config
    guards = [api_key_guard(config.api_keys)] if config.api_keys else []
    model_routes = Router(
        path="/",
        route_handlers=[
            *routes_openai.ROUTES,
            *routes_responses.ROUTES,
            *routes_embeddings.ROUTES,
            *routes_anthropic.ROUTES,
            *routes_misc.PROTECTED_ROUTES,
        ],
        guards=guards,
    )
    cors = (
        CORSConfig(allow_origins=config.cors_allow_origins, allow_methods=["*"], allow_headers=["*"])
        if config.cors_allow_origins
        else None
    )

    async def drain() -> None:
        await state.drain()

    def provide_state() -> ServerState:
        return state

    return Litestar(
        route_handlers=[model_routes, *routes_misc.OPEN_ROUTES, *(web_routes() if config.web_ui else [])],
        dependencies={"server": Provide(provide_state, sync_to_thread=False)},
        exception_handlers={Exception: handle_exception},
        middleware=[DefineMiddleware(access_log), DefineMiddleware(_count_requests, metrics=state.metrics)],
        logging_config=None,  # `atlas serve` configures logging (--log-level); the app leaves it alone
        request_max_body_size=config.max_body_bytes,
        cors_config=cors,
        openapi_config=OpenAPIConfig(
            title="Atlas",
            version=__version__,
            description="OpenAI- and Anthropic-compatible LLM inference server",
        ),
        on_shutdown=[drain],
        signature_namespace={"ServerState": ServerState, "Any": Any},
    )
