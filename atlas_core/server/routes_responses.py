"""OpenAI Responses API routes: ``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``.

A response runs on the chat completion path: the same prompt rendering, request limits, output
parsers (reasoning, tool calls), structured-output constraints and engine requests; only the
request and response shapes differ (`responses_prompt`, `responses_output`, `responses_stream`).
Responses are kept in the server's bounded in-memory store unless ``store`` is false, so that
``previous_response_id`` continues a conversation.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from litestar import Request, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody
from litestar.response import Stream

from atlas_core.server.chat_prompt import render
from atlas_core.server.constraints import REASONING_EFFORT_BUDGET, constraint_fields
from atlas_core.server.errors import APIError
from atlas_core.server.generation import final, generate, start, unless_disconnected
from atlas_core.server.output_parsing import ParserSpec
from atlas_core.server.responses_output import new_id
from atlas_core.server.responses_prompt import responses_setup
from atlas_core.server.responses_result import ResponseContext, whole_response
from atlas_core.server.responses_store import StoredResponse
from atlas_core.server.responses_stream import ResponseEvents, response_stream
from atlas_core.server.sampling import check_max_tokens, check_prompt_length, check_request_work, sampling_params
from atlas_core.server.schemas_openai import SamplerFields
from atlas_core.server.schemas_responses import (
    DeletedResponse,
    FunctionToolChoice,
    ResponseObject,
    ResponsesRequest,
    TextConfig,
)
from atlas_core.server.state import ServerState
from atlas_core.server.streaming import event_stream

TAGS = ["OpenAI"]


@post("/v1/responses", status_code=200, tags=TAGS, summary="Create a model response (streamed when stream is true)")
async def create_response(
    data: JSONBody[ResponsesRequest], server: NamedDependency[ServerState], request: Request[Any, Any, Any]
) -> ResponseObject | Stream:
    runtime = server.runtime_for(data.model)
    history: list[dict[str, Any]] = []
    if data.previous_response_id is not None:
        history = _stored(server, data.previous_response_id, param="previous_response_id").messages
    prepared = responses_setup(server, data, history)
    prompt = await asyncio.to_thread(render, runtime, prepared.setup, check_length=False)
    check_prompt_length(len(prompt.ids), runtime.max_seq_len, param="input")
    check_max_tokens(data.max_output_tokens, runtime.max_seq_len, param="max_output_tokens")
    check_request_work(server.config, [len(prompt.ids)], 1, data.max_output_tokens, runtime.max_seq_len)
    parsers = ParserSpec(server, prepared.setup, prompt.text)
    effort = data.reasoning.effort if data.reasoning else None
    constraints = await asyncio.to_thread(
        constraint_fields,
        parsers,
        runtime.tokenizer,
        response_format=prepared.response_format,
        thinking_tokens=REASONING_EFFORT_BUDGET.get(effort or ""),
    )
    fields = SamplerFields(
        temperature=data.temperature,
        top_p=data.top_p,
        top_k=data.top_k,
        min_p=data.min_p,
        repetition_penalty=data.repetition_penalty,
        presence_penalty=data.presence_penalty,
        frequency_penalty=data.frequency_penalty,
        seed=data.seed,
        stop=data.stop,
    )
    params = sampling_params(
        fields, max_tokens=data.max_output_tokens, defaults=server.config.generation_defaults, **constraints
    )
    tool_choice = prepared.setup.tool_choice
    base = ResponseObject(
        id=new_id("resp"),
        created_at=int(time.time()),
        model=server.model_name,
        status="in_progress",
        output=[],
        tools=prepared.tools,
        tool_choice=FunctionToolChoice(name=tool_choice["name"]) if isinstance(tool_choice, dict) else tool_choice,
        parallel_tool_calls=data.parallel_tool_calls,
        text=data.text or TextConfig(),
        instructions=data.instructions,
        previous_response_id=data.previous_response_id,
        max_output_tokens=data.max_output_tokens,
        temperature=data.temperature,
        top_p=data.top_p,
        reasoning=data.reasoning,
        store=data.store,
        metadata=data.metadata or {},
    )
    ctx = ResponseContext(
        base=base,
        parsers=parsers,
        tokenizer=runtime.tokenizer,
        conversation=prepared.conversation,
        store=server.responses if data.store else None,
    )
    stream = generate(server, prompt.text, prompt.ids, params)
    if data.stream:
        started = await unless_disconnected(request.receive, start(stream))
        events = ResponseEvents()
        return event_stream(response_stream(started, ctx, events), events.error)
    return whole_response(await unless_disconnected(request.receive, final(stream)), ctx)


def _stored(server: ServerState, response_id: str, *, param: str | None) -> StoredResponse:
    """The stored response ``response_id``; 404 naming ``param`` when it is not (or no longer) kept."""
    entry = server.responses.get(response_id)
    if entry is None:
        raise APIError(
            404,
            f"no stored response with id {response_id!r}: it was never stored (store: false), was deleted, or was "
            f"dropped from this server's store (it keeps the last {server.config.responses_store_size} responses, "
            "--responses-store-size, in memory only)",
            param=param,
        )
    return entry


@get("/v1/responses/{response_id:str}", tags=TAGS, summary="Retrieve a stored response")
async def retrieve_response(response_id: FromPath[str], server: NamedDependency[ServerState]) -> ResponseObject:
    return _stored(server, response_id, param=None).response


@delete("/v1/responses/{response_id:str}", status_code=200, tags=TAGS, summary="Delete a stored response")
async def delete_response(response_id: FromPath[str], server: NamedDependency[ServerState]) -> DeletedResponse:
    _stored(server, response_id, param=None)
    server.responses.delete(response_id)
    return DeletedResponse(id=response_id)


ROUTES = [create_response, retrieve_response, delete_response]
