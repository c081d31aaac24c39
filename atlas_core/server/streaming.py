"""Server-sent events: encoding, the response object, errors after the stream began, and per-choice
progress through cumulative engine outputs."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from litestar.response import Stream

from atlas_core.engine.outputs import CompletionOutput, PositionLogprobs
from atlas_core.server.errors import APIError, anthropic_error, as_api_error, openai_error

_encoder = msgspec.json.Encoder()

DONE = b"data: [DONE]\n\n"


def sse(payload: Any) -> bytes:
    """One ``data:`` event (OpenAI style)."""
    return b"data: " + _encoder.encode(payload) + b"\n\n"


def named_sse(event: str, payload: Any) -> bytes:
    """One ``event:`` + ``data:`` event (Anthropic style)."""
    return b"event: " + event.encode() + b"\ndata: " + _encoder.encode(payload) + b"\n\n"


def openai_error_event(error: APIError) -> bytes:
    """An error after the stream began: an ``error`` object, then ``[DONE]`` (the OpenAI SDK raises it)."""
    return sse(openai_error(error)) + DONE


def anthropic_error_event(error: APIError) -> bytes:
    return named_sse("error", anthropic_error(error))


class EventStream(Stream):
    """A `Stream` whose own media type wins over the handler's (Litestar prefers the handler's, which
    is ``application/json`` for handlers that return JSON or a stream)."""

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["media_type"] = self.media_type
        return super().to_asgi_response(*args, **kwargs)


def event_stream(body: AsyncGenerator[bytes, None], on_error: Callable[[APIError], bytes]) -> Stream:
    """An SSE response of ``body``; an exception inside it ends the stream with ``on_error``'s event."""

    async def guarded() -> AsyncGenerator[bytes, None]:
        try:
            async for chunk in body:
                yield chunk
        except Exception as exc:
            yield on_error(as_api_error(exc))
        finally:
            await body.aclose()

    return EventStream(
        guarded(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


@dataclass
class Progress:
    """What of one completion was already sent: characters of text and generated tokens."""

    chars: int = 0
    tokens: int = 0
    finished: bool = False

    def advance(self, completion: CompletionOutput) -> tuple[str, list[int], list[PositionLogprobs]]:
        """New text, new token ids and their logprobs since the last call."""
        text = completion.text[self.chars :]
        ids = completion.token_ids[self.tokens :]
        logprobs = (completion.logprobs or [])[self.tokens :] if completion.logprobs is not None else []
        self.chars, self.tokens = len(completion.text), len(completion.token_ids)
        return text, ids, logprobs
