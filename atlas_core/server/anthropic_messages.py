"""Anthropic Messages responses: the whole message and the standard SSE sequence
(``message_start``, ``ping``, ``content_block_start`` / ``_delta`` / ``_stop``, ``message_delta``,
``message_stop``). Reasoning becomes ``thinking`` blocks, tool calls ``tool_use`` blocks whose
input streams as ``input_json_delta`` fragments."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from atlas_core.engine.outputs import CompletionOutput, RequestOutput
from atlas_core.parsing.types import ContentDelta, ReasoningDelta, StreamEvent, ToolCallArgumentsDelta, ToolCallStart
from atlas_core.server.output_parsing import ParserSpec
from atlas_core.server.schemas_anthropic import (
    ContentBlockDelta,
    ContentBlockStart,
    ContentBlockStop,
    DeltaUsage,
    InputJSONDelta,
    MessageDelta,
    MessageResponse,
    MessageStart,
    MessageStop,
    MessageUsage,
    Ping,
    ResponseBlock,
    StopInfo,
    TextContent,
    TextDelta,
    ThinkingContent,
    ThinkingDelta,
    ToolUseContent,
)
from atlas_core.server.streaming import Progress, named_sse


@dataclass
class MessageContext:
    message_id: str
    model: str
    parsers: ParserSpec


def stop_reason(completion: CompletionOutput, called_tools: bool) -> StopInfo:
    """Anthropic's ``stop_reason`` / ``stop_sequence`` for a finished completion."""
    if completion.finish_reason == "stop" and called_tools:
        return StopInfo("tool_use", None)
    if completion.finish_reason == "length":
        return StopInfo("max_tokens", None)
    if isinstance(completion.stop_reason, str):
        return StopInfo("stop_sequence", completion.stop_reason)
    return StopInfo("end_turn", None)


def _tool_input(arguments: str) -> dict[str, Any]:
    value = json.loads(arguments) if arguments.strip() else {}
    return value if isinstance(value, dict) else {"value": value}


def message_response(output: RequestOutput, ctx: MessageContext) -> MessageResponse:
    """The non-streamed message."""
    completion = output.outputs[0]
    parser = ctx.parsers.new()
    parser.feed(completion.text)
    _, message = parser.finish()
    content: list[ResponseBlock] = []
    if message.reasoning is not None:
        content.append(ThinkingContent(thinking=message.reasoning))
    if message.content or not message.tool_calls:
        content.append(TextContent(text=message.content))
    content.extend(ToolUseContent(id=c.id, name=c.name, input=_tool_input(c.arguments)) for c in message.tool_calls)
    stop = stop_reason(completion, parser.called_tools)
    return MessageResponse(
        id=ctx.message_id,
        model=ctx.model,
        content=content,
        stop_reason=stop.stop_reason,
        stop_sequence=stop.stop_sequence,
        usage=MessageUsage(
            input_tokens=len(output.prompt_token_ids),
            output_tokens=len(completion.token_ids),
            cache_read_input_tokens=output.num_cached_tokens,
        ),
    )


class _Blocks:
    """Opens, fills and closes content blocks as parser events arrive."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: object = None  # "text", "thinking", or ("tool", call index)

    def _switch(self, kind: object, block: ResponseBlock) -> list[bytes]:
        if self.kind == kind:
            return []
        out = self.close()
        self.index += 1
        self.kind = kind
        return [*out, named_sse("content_block_start", ContentBlockStart(self.index, block))]

    def close(self) -> list[bytes]:
        if self.kind is None:
            return []
        self.kind = None
        return [named_sse("content_block_stop", ContentBlockStop(self.index))]

    def feed(self, events: list[StreamEvent]) -> list[bytes]:
        out: list[bytes] = []
        for event in events:
            if isinstance(event, ContentDelta):
                out += self._switch("text", TextContent(text=""))
                out.append(named_sse("content_block_delta", ContentBlockDelta(self.index, TextDelta(event.text))))
            elif isinstance(event, ReasoningDelta):
                out += self._switch("thinking", ThinkingContent(thinking=""))
                out.append(named_sse("content_block_delta", ContentBlockDelta(self.index, ThinkingDelta(event.text))))
            elif isinstance(event, ToolCallStart):
                out += self._switch(("tool", event.index), ToolUseContent(id=event.id, name=event.name, input={}))
            elif isinstance(event, ToolCallArgumentsDelta) and self.kind == ("tool", event.index):
                out.append(
                    named_sse("content_block_delta", ContentBlockDelta(self.index, InputJSONDelta(event.fragment)))
                )
        return out


async def message_stream(
    stream: AsyncGenerator[RequestOutput, None], ctx: MessageContext, num_prompt_tokens: int
) -> AsyncGenerator[bytes, None]:
    """The ``text/event-stream`` body of a streamed message."""
    start = MessageResponse(
        id=ctx.message_id,
        model=ctx.model,
        content=[],
        stop_reason=None,
        stop_sequence=None,
        usage=MessageUsage(input_tokens=num_prompt_tokens, output_tokens=0),
    )
    yield named_sse("message_start", MessageStart(start))
    yield named_sse("ping", Ping())
    parser = ctx.parsers.new()
    blocks = _Blocks()
    progress = Progress()
    last = None
    async for last in stream:
        completion = last.outputs[0]
        text, _, _ = progress.advance(completion)
        events = parser.feed(text)
        if completion.finish_reason is not None:
            events += parser.finish()[0]
        for event in blocks.feed(events):
            yield event
    for event in blocks.close():
        yield event
    if last is not None:
        completion = last.outputs[0]
        delta = MessageDelta(stop_reason(completion, parser.called_tools), DeltaUsage(len(completion.token_ids)))
        yield named_sse("message_delta", delta)
    yield named_sse("message_stop", MessageStop())
