"""Tokenizer, health, metrics and OpenAPI routes."""

from __future__ import annotations

import asyncio
from typing import Any

from litestar import Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from atlas_core.server.chat_prompt import openai_setup, render
from atlas_core.server.errors import invalid
from atlas_core.server.schemas_openai import (
    ChatCompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    HealthStatus,
    TokenizeRequest,
    TokenizeResponse,
)
from atlas_core.server.state import ServerState

TAGS = ["Tokenizer"]


@post("/tokenize", status_code=200, tags=TAGS, summary="Token ids of a prompt or of a rendered conversation")
async def tokenize(data: JSONBody[TokenizeRequest], server: NamedDependency[ServerState]) -> TokenizeResponse:
    runtime = server.runtime_for(data.model)
    if (data.prompt is None) == (data.messages is None):
        raise invalid("send exactly one of prompt and messages", param="prompt")
    if data.messages is not None:
        chat = ChatCompletionRequest(
            messages=data.messages,
            tools=data.tools,
            chat_template_kwargs=data.chat_template_kwargs,
            add_generation_prompt=data.add_generation_prompt,
            continue_final_message=data.continue_final_message,
        )
        ids = (await asyncio.to_thread(render, runtime, openai_setup(server, chat), check_length=False)).ids
    else:
        ids = await asyncio.to_thread(
            runtime.tokenizer.encode, data.prompt or "", add_special_tokens=data.add_special_tokens
        )
    return TokenizeResponse(count=len(ids), max_model_len=runtime.max_seq_len, tokens=ids)


@post("/detokenize", status_code=200, tags=TAGS, summary="Text of token ids")
async def detokenize(data: JSONBody[DetokenizeRequest], server: NamedDependency[ServerState]) -> DetokenizeResponse:
    runtime = server.runtime_for(data.model)
    vocab = runtime.vocab_size
    bad = [t for t in data.tokens if not 0 <= t < vocab]
    if bad:
        raise invalid(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})", param="tokens")
    return DetokenizeResponse(prompt=await asyncio.to_thread(runtime.tokenizer.decode, data.tokens))


@get("/health", tags=["Server"], summary="200 when serving; 503 while the model loads or the server shuts down")
async def health(server: NamedDependency[ServerState]) -> Response[HealthStatus]:
    if server.shutting_down:
        return Response(HealthStatus("shutting_down"), status_code=503)
    if server.runtime is None:
        return Response(HealthStatus("loading"), status_code=503)
    return Response(HealthStatus("ok"), status_code=200)


@get("/metrics", tags=["Server"], summary="Prometheus metrics")
async def metrics(server: NamedDependency[ServerState]) -> Response[bytes]:
    return Response(server.metrics.render(), media_type=server.metrics.content_type)


@get("/openapi.json", include_in_schema=False)
async def openapi_document(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The OpenAPI document (also at Litestar's ``/schema/openapi.json``)."""
    return request.app.openapi_schema.to_schema()


PROTECTED_ROUTES = [tokenize, detokenize]
OPEN_ROUTES = [health, metrics, openapi_document]
