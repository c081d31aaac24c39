"""msgspec schemas of the OpenAI-compatible endpoints.

Requests accept OpenAI's fields plus vLLM's sampler extensions (``top_k``, ``min_p``,
``repetition_penalty``, ...); unknown fields are ignored, as OpenAI clients send many. Responses
carry exactly OpenAI's fields, plus ``reasoning_content`` on assistant messages.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

# ---------------------------------------------------------------- shared request parts


class SamplerFields(msgspec.Struct, kw_only=True):
    """Sampling fields of both completion endpoints; meanings and ranges as in `SamplingParams`.
    None means the engine default."""

    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    top_n_sigma: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    max_tokens: int | None = None


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


# ---------------------------------------------------------------- chat requests


class TextPart(msgspec.Struct, tag_field="type", tag="text"):
    text: str


class ImageURL(msgspec.Struct):
    url: str


class ImagePart(msgspec.Struct, tag_field="type", tag="image_url"):
    image_url: ImageURL


ContentPart = TextPart | ImagePart


class FunctionCall(msgspec.Struct):
    """The function a tool call invokes; ``arguments`` is a JSON object as text."""

    name: str
    arguments: str


class ToolCall(msgspec.Struct, kw_only=True):
    """A tool call: of an assistant message in a response, or of an earlier assistant turn in a request."""

    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class ChatMessage(msgspec.Struct, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionDefinition(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(msgspec.Struct, kw_only=True):
    function: FunctionDefinition
    type: Literal["function"] = "function"


class NamedFunction(msgspec.Struct):
    name: str


class NamedToolChoice(msgspec.Struct, kw_only=True):
    function: NamedFunction
    type: Literal["function"] = "function"


class JSONSchemaSpec(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str = "response"
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class TextFormat(msgspec.Struct, tag_field="type", tag="text"):
    pass


class JSONObjectFormat(msgspec.Struct, tag_field="type", tag="json_object"):
    pass


class JSONSchemaFormat(msgspec.Struct, tag_field="type", tag="json_schema"):
    json_schema: JSONSchemaSpec


ResponseFormat = TextFormat | JSONObjectFormat | JSONSchemaFormat


class ChatCompletionRequest(SamplerFields, kw_only=True):
    messages: list[ChatMessage]
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    user: str | None = None


class CompletionRequest(SamplerFields, kw_only=True):
    prompt: str | list[str | int | list[int]]
    """A string, a list of strings, a list of token ids, or a list of token-id lists."""
    max_tokens: int | None = 16
    stream: bool = False
    stream_options: StreamOptions | None = None
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    user: str | None = None


# ---------------------------------------------------------------- responses


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int = 0


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class TopLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    """A generated token's logprob and its most likely alternatives."""

    top_logprobs: list[TopLogprob]


class ChatLogprobs(msgspec.Struct):
    content: list[TokenLogprob]


class AssistantMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChatLogprobs | None = None


class ChatCompletion(msgspec.Struct, kw_only=True):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: str = "chat.completion"


class ToolCallFunctionDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    index: int
    id: str | None = None
    type: str | None = None
    function: ToolCallFunctionDelta | None = None


class ChatDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    object: str = "chat.completion.chunk"


class CompletionLogprobs(msgspec.Struct, kw_only=True):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(msgspec.Struct, kw_only=True):
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class Completion(msgspec.Struct, kw_only=True):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    object: str = "text_completion"


class ModelCard(msgspec.Struct, kw_only=True):
    id: str
    created: int
    owned_by: str = "atlas"
    max_model_len: int | None = None
    object: str = "model"


class ModelList(msgspec.Struct, kw_only=True):
    data: list[ModelCard]
    object: str = "list"


# ---------------------------------------------------------------- tokenizer endpoints (vLLM's shapes)


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """Either ``prompt`` (raw text) or ``messages`` (rendered with the chat template first)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[ChatTool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class TokenizeResponse(msgspec.Struct, kw_only=True):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    tokens: list[int]
    model: str | None = None


class DetokenizeResponse(msgspec.Struct, kw_only=True):
    prompt: str


class HealthStatus(msgspec.Struct):
    status: str
