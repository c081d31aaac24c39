"""msgspec schemas of OpenAI's Responses API (``/v1/responses``): the request, the response
object with its output items, and the typed stream events.

``input`` items are kept as plain objects here and checked one by one in
`atlas_core.server.responses_prompt`, because a message item may leave out its ``type`` (which a
tagged union cannot express) and a bad item should get a 400 naming ``input[i]``. Unknown request
fields are ignored, as clients send many (``include``, ``truncation``, ``prompt_cache_key``, ...).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

# ---------------------------------------------------------------- request


class ResponsesTool(msgspec.Struct, kw_only=True):
    """A tool of the request; only ``type`` ``function`` is served (checked by the route)."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionToolChoice(msgspec.Struct, kw_only=True, tag_field="type", tag="function"):
    name: str


class TextFormatPlain(msgspec.Struct, tag_field="type", tag="text"):
    pass


class TextFormatJSONObject(msgspec.Struct, tag_field="type", tag="json_object"):
    pass


class TextFormatJSONSchema(msgspec.Struct, kw_only=True, omit_defaults=True, tag_field="type", tag="json_schema"):
    schema: dict[str, Any]
    name: str = "response"
    description: str | None = None
    strict: bool | None = None


TextFormat = TextFormatPlain | TextFormatJSONObject | TextFormatJSONSchema


class TextConfig(msgspec.Struct, kw_only=True, omit_defaults=True):
    format: TextFormat = msgspec.field(default_factory=TextFormatPlain)
    verbosity: str | None = None


class ReasoningConfig(msgspec.Struct, kw_only=True, omit_defaults=True):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: str | None = None


class ResponsesRequest(msgspec.Struct, kw_only=True):
    """``POST /v1/responses``. Sampler extensions (``top_k``, ``min_p``, ``seed``, ``stop``, ...)
    mean what they mean on chat completions."""

    model: str | None = None
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    text: TextConfig | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | None = None
    parallel_tool_calls: bool = True
    reasoning: ReasoningConfig | None = None
    metadata: dict[str, str] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    user: str | None = None


# ---------------------------------------------------------------- output items


class OutputText(msgspec.Struct, kw_only=True, tag_field="type", tag="output_text"):
    text: str
    annotations: list[Any] = msgspec.field(default_factory=list)
    logprobs: list[Any] = msgspec.field(default_factory=list)


class ReasoningText(msgspec.Struct, kw_only=True, tag_field="type", tag="reasoning_text"):
    text: str


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class MessageItem(msgspec.Struct, kw_only=True, tag_field="type", tag="message"):
    id: str
    status: ItemStatus
    content: list[OutputText]
    role: str = "assistant"


class ReasoningItem(msgspec.Struct, kw_only=True, tag_field="type", tag="reasoning"):
    id: str
    status: ItemStatus
    content: list[ReasoningText]
    summary: list[Any] = msgspec.field(default_factory=list)


class FunctionCallItem(msgspec.Struct, kw_only=True, tag_field="type", tag="function_call"):
    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


OutputItem = MessageItem | ReasoningItem | FunctionCallItem


# ---------------------------------------------------------------- the response object


class InputTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(msgspec.Struct, kw_only=True):
    reasoning_tokens: int = 0


class ResponseUsage(msgspec.Struct, kw_only=True):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens_details: OutputTokensDetails


class IncompleteDetails(msgspec.Struct):
    reason: str


class ResponseErrorInfo(msgspec.Struct):
    code: str
    message: str


class FunctionToolOut(msgspec.Struct, kw_only=True, tag_field="type", tag="function"):
    """A function tool as echoed in the response."""

    name: str
    parameters: dict[str, Any]
    description: str | None = None
    strict: bool | None = None


class ResponseObject(msgspec.Struct, kw_only=True):
    """The response (``object`` ``response``), as returned, stored and carried by lifecycle events."""

    id: str
    created_at: int
    model: str
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    output: list[OutputItem]
    tools: list[FunctionToolOut]
    tool_choice: str | FunctionToolChoice
    parallel_tool_calls: bool
    text: TextConfig
    object: str = "response"
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    reasoning: ReasoningConfig | None = None
    store: bool = True
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    usage: ResponseUsage | None = None
    incomplete_details: IncompleteDetails | None = None
    error: ResponseErrorInfo | None = None
    completed_at: int | None = None


class DeletedResponse(msgspec.Struct, kw_only=True):
    id: str
    deleted: bool = True
    object: str = "response.deleted"


# ---------------------------------------------------------------- stream events (each gets a sequence_number)


class ResponseCreated(msgspec.Struct, kw_only=True, tag_field="type", tag="response.created"):
    response: ResponseObject
    sequence_number: int = 0


class ResponseInProgress(msgspec.Struct, kw_only=True, tag_field="type", tag="response.in_progress"):
    response: ResponseObject
    sequence_number: int = 0


class ResponseCompleted(msgspec.Struct, kw_only=True, tag_field="type", tag="response.completed"):
    response: ResponseObject
    sequence_number: int = 0


class ResponseIncomplete(msgspec.Struct, kw_only=True, tag_field="type", tag="response.incomplete"):
    response: ResponseObject
    sequence_number: int = 0


class OutputItemAdded(msgspec.Struct, kw_only=True, tag_field="type", tag="response.output_item.added"):
    output_index: int
    item: OutputItem
    sequence_number: int = 0


class OutputItemDone(msgspec.Struct, kw_only=True, tag_field="type", tag="response.output_item.done"):
    output_index: int
    item: OutputItem
    sequence_number: int = 0


class ContentPartAdded(msgspec.Struct, kw_only=True, tag_field="type", tag="response.content_part.added"):
    item_id: str
    output_index: int
    content_index: int
    part: OutputText | ReasoningText
    sequence_number: int = 0


class ContentPartDone(msgspec.Struct, kw_only=True, tag_field="type", tag="response.content_part.done"):
    item_id: str
    output_index: int
    content_index: int
    part: OutputText | ReasoningText
    sequence_number: int = 0


class OutputTextDelta(msgspec.Struct, kw_only=True, tag_field="type", tag="response.output_text.delta"):
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any] = msgspec.field(default_factory=list)
    sequence_number: int = 0


class OutputTextDone(msgspec.Struct, kw_only=True, tag_field="type", tag="response.output_text.done"):
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any] = msgspec.field(default_factory=list)
    sequence_number: int = 0


class ReasoningTextDelta(msgspec.Struct, kw_only=True, tag_field="type", tag="response.reasoning_text.delta"):
    item_id: str
    output_index: int
    content_index: int
    delta: str
    sequence_number: int = 0


class ReasoningTextDone(msgspec.Struct, kw_only=True, tag_field="type", tag="response.reasoning_text.done"):
    item_id: str
    output_index: int
    content_index: int
    text: str
    sequence_number: int = 0


class ArgumentsDelta(msgspec.Struct, kw_only=True, tag_field="type", tag="response.function_call_arguments.delta"):
    item_id: str
    output_index: int
    delta: str
    sequence_number: int = 0


class ArgumentsDone(msgspec.Struct, kw_only=True, tag_field="type", tag="response.function_call_arguments.done"):
    item_id: str
    output_index: int
    name: str
    arguments: str
    sequence_number: int = 0


class ErrorEvent(msgspec.Struct, kw_only=True, tag_field="type", tag="error"):
    """An error after the stream began (the stream ends after it)."""

    message: str
    code: str | None = None
    param: str | None = None
    sequence_number: int = 0


ItemEvent = (
    OutputItemAdded
    | OutputItemDone
    | ContentPartAdded
    | ContentPartDone
    | OutputTextDelta
    | OutputTextDone
    | ReasoningTextDelta
    | ReasoningTextDone
    | ArgumentsDelta
    | ArgumentsDone
)
ResponseStreamEvent = (
    ResponseCreated | ResponseInProgress | ResponseCompleted | ResponseIncomplete | ItemEvent | ErrorEvent
)
