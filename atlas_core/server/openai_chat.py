"""OpenAI chat completion responses: the whole-response JSON and the ``chat.completion.chunk`` stream.

Each completion's text goes through its own `CompletionParser`: reasoning becomes
``reasoning_content``, tool calls become ``tool_calls`` (streamed as an id-and-name delta, then
argument fragments), and ``finish_reason`` is ``tool_calls`` when a completion that stopped
naturally made calls.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from atlas_core.engine.outputs import CompletionOutput, RequestOutput
from atlas_core.parsing.types import ContentDelta, ReasoningDelta, StreamEvent, ToolCallArgumentsDelta, ToolCallStart
from atlas_core.server.logprob_format import TokenTexts, chat_logprobs
from atlas_core.server.output_parsing import CompletionParser, ParserSpec
from atlas_core.server.schemas_openai import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    FunctionCall,
    PromptTokensDetails,
    ToolCall,
    ToolCallDelta,
    ToolCallFunctionDelta,
    Usage,
)
from atlas_core.server.streaming import DONE, Progress, sse

log = logging.getLogger("atlas.server")


@dataclass
class ChatContext:
    """What a response needs besides the engine outputs."""

    response_id: str
    created: int
    model: str
    parsers: ParserSpec
    texts: TokenTexts
    top_logprobs: int | None  # None: no logprobs asked
    include_usage: bool = False


def usage_of(output: RequestOutput) -> Usage:
    prompt = len(output.prompt_token_ids)
    completion = sum(len(c.token_ids) for c in output.outputs)
    return Usage(prompt, completion, prompt + completion, PromptTokensDetails(output.num_cached_tokens))


def finish_reason(completion: CompletionOutput, called_tools: bool) -> str | None:
    if completion.finish_reason == "stop" and called_tools:
        return "tool_calls"
    return completion.finish_reason


def chat_completion(output: RequestOutput, ctx: ChatContext) -> ChatCompletion:
    """The non-streamed response."""
    choices = []
    for completion in output.outputs:
        parser = ctx.parsers.new()
        parser.feed(completion.text)
        _, message = parser.finish()
        if message.problems:
            log.info("tool-call output kept as text: %s", "; ".join(message.problems))
        calls = [ToolCall(id=c.id, function=FunctionCall(c.name, c.arguments)) for c in message.tool_calls]
        logprobs = None
        if ctx.top_logprobs is not None:
            logprobs = chat_logprobs(completion.logprobs or [], completion.token_ids, ctx.top_logprobs, ctx.texts)
        choices.append(
            ChatChoice(
                index=completion.index,
                message=AssistantMessage(
                    role="assistant",
                    content=message.content if message.content or not calls else None,
                    reasoning_content=message.reasoning,
                    tool_calls=calls or None,
                ),
                finish_reason=finish_reason(completion, parser.called_tools),
                logprobs=logprobs,
            )
        )
    return ChatCompletion(
        id=ctx.response_id, created=ctx.created, model=ctx.model, choices=choices, usage=usage_of(output)
    )


def deltas_of(events: list[StreamEvent]) -> list[ChatDelta]:
    """Parser events -> chat deltas, merging runs of the same kind (content, reasoning, one call's
    argument fragments); a call's id-and-name delta always stands alone, before its arguments."""
    deltas: list[ChatDelta] = []
    for event in events:
        last = deltas[-1] if deltas else None
        if isinstance(event, ContentDelta):
            if (
                last is not None
                and last.content is not None
                and last.tool_calls is None
                and last.reasoning_content is None
            ):
                last.content += event.text
            else:
                deltas.append(ChatDelta(content=event.text))
        elif isinstance(event, ReasoningDelta):
            if (
                last is not None
                and last.reasoning_content is not None
                and last.content is None
                and last.tool_calls is None
            ):
                last.reasoning_content += event.text
            else:
                deltas.append(ChatDelta(reasoning_content=event.text))
        elif isinstance(event, ToolCallStart):
            function = ToolCallFunctionDelta(name=event.name, arguments="")
            deltas.append(
                ChatDelta(
                    tool_calls=[ToolCallDelta(index=event.index, id=event.id, type="function", function=function)]
                )
            )
        elif isinstance(event, ToolCallArgumentsDelta):
            call = last.tool_calls[-1] if last is not None and last.tool_calls else None
            if call is not None and call.index == event.index and call.id is None and call.function is not None:
                call.function.arguments = (call.function.arguments or "") + event.fragment
            else:
                fragment = ToolCallFunctionDelta(arguments=event.fragment)
                deltas.append(ChatDelta(tool_calls=[ToolCallDelta(index=event.index, function=fragment)]))
    return deltas


class _ChoiceStream:
    def __init__(self, index: int, parser: CompletionParser) -> None:
        self.index = index
        self.parser = parser
        self.progress = Progress()

    def advance(self, completion: CompletionOutput, ctx: ChatContext) -> list[ChatChunkChoice]:
        if self.progress.finished:
            return []
        text, ids, positions = self.progress.advance(completion)
        events = self.parser.feed(text)
        done = completion.finish_reason is not None
        if done:
            events += self.parser.finish()[0]
            self.progress.finished = True
        choices = [ChatChunkChoice(index=self.index, delta=delta) for delta in deltas_of(events)]
        if ctx.top_logprobs is not None and ids:
            if not choices:
                choices.append(ChatChunkChoice(index=self.index, delta=ChatDelta(content="")))
            choices[0].logprobs = chat_logprobs(positions, ids, ctx.top_logprobs, ctx.texts)
        if done:
            reason = finish_reason(completion, self.parser.called_tools)
            choices.append(ChatChunkChoice(index=self.index, delta=ChatDelta(), finish_reason=reason))
        return choices


async def chat_stream(
    stream: AsyncGenerator[RequestOutput, None], ctx: ChatContext, n: int
) -> AsyncGenerator[bytes, None]:
    """The ``text/event-stream`` body: a role chunk per choice, deltas, finish chunks, usage, ``[DONE]``."""
    choices = [_ChoiceStream(i, ctx.parsers.new()) for i in range(n)]

    def chunk(items: list[ChatChunkChoice]) -> bytes:
        return sse(ChatCompletionChunk(id=ctx.response_id, created=ctx.created, model=ctx.model, choices=items))

    yield chunk([ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content="")) for i in range(n)])
    last = None
    async for last in stream:
        for completion in last.outputs:
            for item in choices[completion.index].advance(completion, ctx):
                yield chunk([item])
    if ctx.include_usage and last is not None:
        yield sse(
            ChatCompletionChunk(
                id=ctx.response_id, created=ctx.created, model=ctx.model, choices=[], usage=usage_of(last)
            )
        )
    yield DONE
