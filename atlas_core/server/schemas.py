"""msgspec schemas of the OpenAI-compatible endpoints (requests are lenient, responses exact)."""

from __future__ import annotations

from typing import Any

import msgspec


class ChatMessage(msgspec.Struct, omit_defaults=True):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class SamplingFields(msgspec.Struct, kw_only=True):
    """Sampling fields shared by the completion endpoints (meanings as in `SamplingParams`)."""

    model: str | None = None
    stream: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(SamplingFields, kw_only=True):
    prompt: str | list[int]
    max_tokens: int | None = 16


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ErrorBody(msgspec.Struct):
    message: str
    type: str
    code: int


class ErrorResponse(msgspec.Struct):
    error: ErrorBody
