"""OpenAI routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models[/{id}]``."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from litestar import Request, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody
from litestar.response import Stream

from atlas_core.engine.outputs import RequestOutput
from atlas_core.server.chat_prompt import openai_setup, render
from atlas_core.server.constraints import REASONING_EFFORT_BUDGET, constraint_fields
from atlas_core.server.errors import invalid
from atlas_core.server.generation import final, generate, start, unless_disconnected
from atlas_core.server.logprob_format import TokenTexts
from atlas_core.server.openai_chat import ChatContext, chat_completion, chat_stream
from atlas_core.server.openai_completions import (
    CompletionContext,
    completion_response,
    completion_stream,
    prompt_items,
    prompts_of,
)
from atlas_core.server.output_parsing import ParserSpec
from atlas_core.server.sampling import check_max_tokens, check_request_work, check_sequences, sampling_params
from atlas_core.server.schemas_openai import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ModelCard,
    ModelList,
    StreamOptions,
)
from atlas_core.server.state import ServerState
from atlas_core.server.streaming import event_stream, openai_error_event

TAGS = ["OpenAI"]


@post(
    "/v1/chat/completions",
    status_code=200,
    tags=TAGS,
    summary="Create a chat completion (streamed when stream is true)",
)
async def chat_completions(
    data: JSONBody[ChatCompletionRequest], server: NamedDependency[ServerState], request: Request[Any, Any, Any]
) -> ChatCompletion | Stream:
    runtime = server.runtime_for(data.model)
    check_sequences(server.config, 1, data.n)
    setup = openai_setup(server, data)
    prompt = await asyncio.to_thread(render, runtime, setup)
    max_tokens = data.max_completion_tokens if data.max_completion_tokens is not None else data.max_tokens
    check_max_tokens(
        max_tokens,
        runtime.max_seq_len,
        param="max_completion_tokens" if data.max_completion_tokens is not None else "max_tokens",
    )
    check_request_work(server.config, [len(prompt.ids)], data.n, max_tokens, runtime.max_seq_len)
    if data.top_logprobs is not None and not data.logprobs:
        raise invalid("top_logprobs needs logprobs: true", param="top_logprobs")
    top = (data.top_logprobs or 0) if data.logprobs else None
    parsers = ParserSpec(server, setup, prompt.text)
    constraints = await asyncio.to_thread(
        constraint_fields,
        parsers,
        runtime.tokenizer,
        response_format=data.response_format,
        thinking_tokens=REASONING_EFFORT_BUDGET.get(data.reasoning_effort or ""),
    )
    params = sampling_params(
        data, max_tokens=max_tokens, logprobs=top, defaults=server.config.generation_defaults, **constraints
    )
    ctx = ChatContext(
        response_id=f"chatcmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=server.model_name,
        parsers=parsers,
        texts=TokenTexts(runtime.tokenizer),
        top_logprobs=top,
        include_usage=_include_usage(data.stream_options),
    )
    stream = generate(server, prompt.text, prompt.ids, params, prompt.images)
    if data.stream:
        started = await unless_disconnected(request.receive, start(stream))
        return event_stream(chat_stream(started, ctx, data.n), openai_error_event)
    return chat_completion(await unless_disconnected(request.receive, final(stream)), ctx)


@post("/v1/completions", status_code=200, tags=TAGS, summary="Create a text completion (streamed when stream is true)")
async def completions(
    data: JSONBody[CompletionRequest], server: NamedDependency[ServerState], request: Request[Any, Any, Any]
) -> Completion | Stream:
    runtime = server.runtime_for(data.model)
    if data.suffix:
        raise invalid("suffix is not supported (no fill-in-the-middle); leave it out", param="suffix")
    items = prompt_items(data)
    check_sequences(server.config, len(items), data.n)
    prompts = await asyncio.to_thread(prompts_of, runtime, items)
    check_max_tokens(data.max_tokens, runtime.max_seq_len)
    check_request_work(server.config, [len(p.ids) for p in prompts], data.n, data.max_tokens, runtime.max_seq_len)
    params = sampling_params(
        data,
        max_tokens=data.max_tokens,
        defaults=server.config.generation_defaults,
        logprobs=data.logprobs,
        prompt_logprobs=data.logprobs if data.echo and data.logprobs is not None else None,
    )
    ctx = CompletionContext(
        response_id=f"cmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=server.model_name,
        n=data.n,
        echo=data.echo,
        logprobs=data.logprobs,
        texts=TokenTexts(runtime.tokenizer),
        include_usage=_include_usage(data.stream_options),
    )
    streams = [generate(server, p.text if p.from_text else None, p.ids, params) for p in prompts]
    if data.stream:
        started = await unless_disconnected(request.receive, _start_all(streams))
        return event_stream(completion_stream(started, prompts, ctx), openai_error_event)
    return completion_response(await unless_disconnected(request.receive, _finish_all(streams)), prompts, ctx)


def _include_usage(options: StreamOptions | None) -> bool:
    """Whether a stream ends with a usage chunk (``stream_options.include_usage``)."""
    return bool(options and options.include_usage)


async def _start_all(streams: list[AsyncGenerator[RequestOutput, None]]) -> list[AsyncGenerator[RequestOutput, None]]:
    """`start` every stream; if one fails, the ones already started are closed (aborted)."""
    started: list[AsyncGenerator[RequestOutput, None]] = []
    try:
        for stream in streams:
            started.append(await start(stream))
    except BaseException:
        for stream in started:
            await stream.aclose()
        raise
    return started


async def _finish_all(streams: list[AsyncGenerator[RequestOutput, None]]) -> list[RequestOutput]:
    """Finish several prompts concurrently (they batch in the engine); a failure cancels the rest."""
    tasks = [asyncio.ensure_future(final(stream)) for stream in streams]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()


def _card(server: ServerState, name: str) -> ModelCard:
    return ModelCard(id=name, created=server.created, max_model_len=server.require_runtime().max_seq_len)


@get("/v1/models", tags=TAGS, summary="List the served model")
async def list_models(server: NamedDependency[ServerState]) -> ModelList:
    server.require_runtime()
    return ModelList(data=[_card(server, server.model_name)])


@get("/v1/models/{model_id:path}", tags=TAGS, summary="Describe the served model")
async def retrieve_model(model_id: FromPath[str], server: NamedDependency[ServerState]) -> ModelCard:
    server.require_runtime()
    name = model_id.lstrip("/")
    if not server.serves(name):
        raise server.unknown_model(name, param=None)
    return _card(server, name)


ROUTES = [chat_completions, completions, list_models, retrieve_model]
