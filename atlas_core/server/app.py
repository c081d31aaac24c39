"""The Litestar application: OpenAI chat/completions endpoints over an `AsyncEngine`."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, get, post
from litestar.exceptions import HTTPException
from litestar.params import JSONBody
from litestar.response import Stream

from atlas_core.engine.async_engine import AsyncEngine
from atlas_core.engine.outputs import RequestOutput
from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.errors import AtlasError, InvalidRequestError
from atlas_core.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    ErrorBody,
    ErrorResponse,
    SamplingFields,
    Usage,
)
from atlas_core.tokenizer import Tokenizer


def _error(status: int, message: str, kind: str) -> Response[ErrorResponse]:
    return Response(ErrorResponse(ErrorBody(message, kind, status)), status_code=status)


def _handle_atlas_error(_: Request[Any, Any, Any], exc: AtlasError) -> Response[ErrorResponse]:
    if isinstance(exc, InvalidRequestError):
        return _error(400, str(exc), "invalid_request_error")
    return _error(500, str(exc), "server_error")


def _handle_http_error(_: Request[Any, Any, Any], exc: HTTPException) -> Response[ErrorResponse]:
    detail = exc.detail if not getattr(exc, "extra", None) else f"{exc.detail}: {exc.extra}"
    return _error(exc.status_code, str(detail), "invalid_request_error")


def _sse(payload: Any) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


def create_app(engine: AsyncEngine, tokenizer: Tokenizer, model_name: str) -> Litestar:
    """Build the app serving ``model_name``; the caller owns the engine's lifetime."""

    def params_of(body: SamplingFields, max_tokens: int | None) -> SamplingParams:
        return SamplingParams(
            n=body.n, max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
            min_p=body.min_p, seed=body.seed, stop=body.stop,
        )

    async def final(stream: AsyncIterator[RequestOutput]) -> RequestOutput:
        last = None
        async for last in stream:
            pass
        assert last is not None
        return last

    async def started(stream: AsyncIterator[RequestOutput]) -> AsyncIterator[RequestOutput]:
        """Wait for the first output so request errors become a 4xx before the stream starts."""
        first = await anext(stream)

        async def chained() -> AsyncIterator[RequestOutput]:
            yield first
            async for item in stream:
                yield item

        return chained()

    def usage(output: RequestOutput) -> Usage:
        prompt, completion = len(output.prompt_token_ids), len(output.outputs[0].token_ids)
        return Usage(prompt, completion, prompt + completion)

    async def streamed(stream: AsyncIterator[RequestOutput], chunk: Any) -> AsyncIterator[bytes]:
        sent = 0
        async for output in stream:
            completion = output.outputs[0]
            delta, sent = completion.text[sent:], len(completion.text)
            if delta or completion.finish_reason:
                yield _sse(chunk(delta, completion.finish_reason))
        yield b"data: [DONE]\n\n"

    @post("/v1/chat/completions")
    async def chat_completions(data: JSONBody[ChatCompletionRequest]) -> Any:
        messages = [msgspec.to_builtins(m) for m in data.messages]
        prompt = tokenizer.apply_chat_template(messages, tools=data.tools, chat_template_kwargs=data.chat_template_kwargs)
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        stream = engine.generate(prompt, ids, params_of(data, data.max_completion_tokens or data.max_tokens))
        response_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if data.stream:
            stream = await started(stream)

            def chunk(delta: str, finish: str | None) -> dict[str, Any]:
                return {
                    "id": response_id, "object": "chat.completion.chunk", "created": created, "model": model_name,
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": delta}, "finish_reason": finish}],
                }

            return Stream(streamed(stream, chunk), media_type="text/event-stream")
        output = await final(stream)
        completion = output.outputs[0]
        return {
            "id": response_id, "object": "chat.completion", "created": created, "model": model_name,
            "choices": [{
                "index": 0, "message": {"role": "assistant", "content": completion.text},
                "finish_reason": completion.finish_reason,
            }],
            "usage": msgspec.to_builtins(usage(output)),
        }

    @post("/v1/completions")
    async def completions(data: JSONBody[CompletionRequest]) -> Any:
        text = data.prompt if isinstance(data.prompt, str) else None
        ids = tokenizer.encode(data.prompt) if isinstance(data.prompt, str) else list(data.prompt)
        stream = engine.generate(text, ids, params_of(data, data.max_tokens))
        response_id, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        if data.stream:
            stream = await started(stream)

            def chunk(delta: str, finish: str | None) -> dict[str, Any]:
                return {
                    "id": response_id, "object": "text_completion", "created": created, "model": model_name,
                    "choices": [{"index": 0, "text": delta, "finish_reason": finish}],
                }

            return Stream(streamed(stream, chunk), media_type="text/event-stream")
        output = await final(stream)
        completion = output.outputs[0]
        return {
            "id": response_id, "object": "text_completion", "created": created, "model": model_name,
            "choices": [{"index": 0, "text": completion.text, "finish_reason": completion.finish_reason}],
            "usage": msgspec.to_builtins(usage(output)),
        }

    @get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "atlas"}]}

    @get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return Litestar(
        route_handlers=[chat_completions, completions, models, health],
        exception_handlers={AtlasError: _handle_atlas_error, HTTPException: _handle_http_error},
        on_shutdown=[engine.shutdown],
    )
