"""Anthropic routes: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

``max_tokens`` is required by the API and clients send their own ceiling (Claude Code asks for
tens of thousands), so a value beyond what the context leaves is served up to the context's end
(``stop_reason`` ``max_tokens``) instead of being refused.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from litestar import Request, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from litestar.response import Stream

from atlas_core.server.anthropic_messages import MessageContext, message_response, message_stream
from atlas_core.server.anthropic_prompt import anthropic_setup
from atlas_core.server.chat_prompt import render
from atlas_core.server.constraints import REASONING_EFFORT_BUDGET, constraint_fields
from atlas_core.server.errors import invalid
from atlas_core.server.generation import final, generate, start, unless_disconnected
from atlas_core.server.output_parsing import ParserSpec
from atlas_core.server.sampling import check_request_work, sampling_params
from atlas_core.server.schemas_anthropic import (
    CountTokensRequest,
    MessageResponse,
    MessagesRequest,
    OutputConfig,
    ThinkingDisabled,
    ThinkingEnabled,
    TokenCount,
)
from atlas_core.server.schemas_openai import JSONSchemaFormat, JSONSchemaSpec, SamplerFields
from atlas_core.server.state import ModelRuntime, ServerState
from atlas_core.server.streaming import anthropic_error_event, event_stream

TAGS = ["Anthropic"]


@post("/v1/messages", status_code=200, tags=TAGS, summary="Create a message (streamed when stream is true)")
async def create_message(
    data: JSONBody[MessagesRequest], server: NamedDependency[ServerState], request: Request[Any, Any, Any]
) -> MessageResponse | Stream:
    runtime = server.runtime_for(data.model)
    if data.max_tokens < 1:
        raise invalid(f"max_tokens must be at least 1, got {data.max_tokens}", param="max_tokens")
    setup = anthropic_setup(server, data)
    prompt = await asyncio.to_thread(render, runtime, setup)
    fields = SamplerFields(temperature=data.temperature, top_p=data.top_p, top_k=data.top_k, stop=data.stop_sequences)
    max_tokens = min(data.max_tokens, runtime.max_seq_len - len(prompt.ids))
    check_request_work(server.config, [len(prompt.ids)], 1, max_tokens, runtime.max_seq_len)
    parsers = ParserSpec(server, setup, prompt.text)
    constraints = await asyncio.to_thread(_constraints, data, parsers, runtime)
    params = sampling_params(fields, max_tokens=max_tokens, defaults=server.config.generation_defaults, **constraints)
    ctx = MessageContext(message_id=f"msg_{uuid.uuid4().hex}", model=server.model_name, parsers=parsers)
    stream = generate(server, prompt.text, prompt.ids, params, prompt.images)
    if data.stream:
        started = await unless_disconnected(request.receive, start(stream))
        return event_stream(message_stream(started, ctx, len(prompt.ids)), anthropic_error_event)
    return message_response(await unless_disconnected(request.receive, final(stream)), ctx)


def _constraints(data: MessagesRequest, parsers: ParserSpec, runtime: ModelRuntime) -> dict[str, Any]:
    """Thinking budget (``thinking.budget_tokens``, else ``output_config.effort``) and JSON output."""
    output = data.output_config or OutputConfig()
    budget: int | None
    if isinstance(data.thinking, ThinkingEnabled):
        budget = data.thinking.budget_tokens
    else:
        budget = (
            REASONING_EFFORT_BUDGET.get(output.effort or "")
            if not isinstance(data.thinking, ThinkingDisabled)
            else None
        )
    response_format = JSONSchemaFormat(JSONSchemaSpec(schema=output.format.schema)) if output.format else None
    return constraint_fields(parsers, runtime.tokenizer, response_format=response_format, thinking_tokens=budget)


@post("/v1/messages/count_tokens", status_code=200, tags=TAGS, summary="Count the prompt tokens of a message request")
async def count_tokens(data: JSONBody[CountTokensRequest], server: NamedDependency[ServerState]) -> TokenCount:
    runtime = server.runtime_for(data.model)
    setup = anthropic_setup(server, data)
    prompt = await asyncio.to_thread(render, runtime, setup, check_length=False)
    return TokenCount(len(prompt.ids))


ROUTES = [create_message, count_tokens]
