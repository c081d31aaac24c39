"""The streamed Responses API answer: typed server-sent events, each with a ``sequence_number``.

The sequence: ``response.created``, ``response.in_progress``, then per output item
``response.output_item.added``, its content (``response.content_part.added``,
``response.output_text.delta`` / ``response.reasoning_text.delta`` or
``response.function_call_arguments.delta``, their ``.done`` events, ``response.content_part.done``)
and ``response.output_item.done``; last ``response.completed``, or ``response.incomplete`` when the
token limit cut the answer. An error after the stream began is an ``error`` event, and the stream
ends there.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from atlas_core.engine.outputs import RequestOutput
from atlas_core.server.errors import APIError, openai_error
from atlas_core.server.responses_output import OutputItems
from atlas_core.server.responses_result import ResponseContext, finalize
from atlas_core.server.schemas_responses import (
    ErrorEvent,
    ResponseCompleted,
    ResponseCreated,
    ResponseIncomplete,
    ResponseInProgress,
    ResponseStreamEvent,
)
from atlas_core.server.streaming import Progress, named_sse


class ResponseEvents:
    """Numbers and encodes the events of one streamed response."""

    def __init__(self) -> None:
        self.sequence_number = 0

    def encode(self, event: ResponseStreamEvent) -> bytes:
        event.sequence_number = self.sequence_number
        self.sequence_number += 1
        return named_sse(str(type(event).__struct_config__.tag), event)

    def error(self, error: APIError) -> bytes:
        """The ``error`` event of a failure after the stream began (`event_stream`'s ``on_error``)."""
        body = openai_error(error).error
        return self.encode(ErrorEvent(message=body.message, code=body.code or body.type, param=body.param))


async def response_stream(
    stream: AsyncGenerator[RequestOutput, None], ctx: ResponseContext, events: ResponseEvents
) -> AsyncGenerator[bytes, None]:
    """The ``text/event-stream`` body (see the module docstring)."""
    yield events.encode(ResponseCreated(response=ctx.base))
    yield events.encode(ResponseInProgress(response=ctx.base))
    parser = ctx.parsers.new()
    built = OutputItems()
    progress = Progress()
    last = None
    async for last in stream:
        completion = last.outputs[0]
        text, _, _ = progress.advance(completion)
        parsed = parser.feed(text)
        if completion.finish_reason is not None:
            parsed += parser.finish()[0]
        for event in built.feed(parsed):
            yield events.encode(event)
    if last is None:
        raise APIError(500, "the engine returned no output for the request")
    for event in built.finish(incomplete=last.outputs[0].finish_reason == "length"):
        yield events.encode(event)
    response = finalize(ctx, last, built)
    if response.status == "incomplete":
        yield events.encode(ResponseIncomplete(response=response))
    else:
        yield events.encode(ResponseCompleted(response=response))
