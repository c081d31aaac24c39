"""msgspec schemas of the Anthropic Messages API (``/v1/messages``, ``/v1/messages/count_tokens``).

Content blocks are tagged unions on ``type``; fields clients send that do not change generation
(``cache_control``, ``citations``, ``metadata``) are accepted and ignored.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

# ---------------------------------------------------------------- request content blocks


class TextBlock(msgspec.Struct, tag_field="type", tag="text", kw_only=True):
    text: str


class ImageBlock(msgspec.Struct, tag_field="type", tag="image", kw_only=True):
    source: dict[str, Any]


class DocumentBlock(msgspec.Struct, tag_field="type", tag="document", kw_only=True):
    source: dict[str, Any]


class ToolUseBlock(msgspec.Struct, tag_field="type", tag="tool_use", kw_only=True):
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(msgspec.Struct, tag_field="type", tag="tool_result", kw_only=True):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock | DocumentBlock] | None = None
    is_error: bool = False


class ThinkingBlock(msgspec.Struct, tag_field="type", tag="thinking", kw_only=True):
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(msgspec.Struct, tag_field="type", tag="redacted_thinking", kw_only=True):
    data: str


RequestBlock = (
    TextBlock | ImageBlock | DocumentBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock
)


class Message(msgspec.Struct, kw_only=True):
    """A turn. ``system`` turns (which some clients, Claude Code among them, place between the
    others) are passed to the chat template as system messages."""

    role: Literal["user", "assistant", "system"]
    content: str | list[RequestBlock]


class Tool(msgspec.Struct, kw_only=True):
    """A client tool. Server tools (``web_search_...``: a ``type`` other than ``custom``) are refused."""

    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None


class ToolChoiceAuto(msgspec.Struct, tag_field="type", tag="auto", kw_only=True):
    disable_parallel_tool_use: bool = False


class ToolChoiceAny(msgspec.Struct, tag_field="type", tag="any", kw_only=True):
    disable_parallel_tool_use: bool = False


class ToolChoiceTool(msgspec.Struct, tag_field="type", tag="tool", kw_only=True):
    name: str
    disable_parallel_tool_use: bool = False


class ToolChoiceNone(msgspec.Struct, tag_field="type", tag="none", kw_only=True):
    pass


ToolChoice = ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone


class ThinkingEnabled(msgspec.Struct, tag_field="type", tag="enabled", kw_only=True):
    budget_tokens: int


class ThinkingDisabled(msgspec.Struct, tag_field="type", tag="disabled", kw_only=True):
    pass


class ThinkingAdaptive(msgspec.Struct, tag_field="type", tag="adaptive", kw_only=True):
    """The model decides how much to think (no budget)."""


class ThinkingBetweenTools(msgspec.Struct, tag_field="type", tag="between_tools", kw_only=True):
    """Thinking between tool calls; served like ``adaptive``."""


ThinkingConfig = ThinkingEnabled | ThinkingDisabled | ThinkingAdaptive | ThinkingBetweenTools


class JSONOutputFormat(msgspec.Struct, tag_field="type", tag="json_schema", kw_only=True):
    schema: dict[str, Any]


class OutputConfig(msgspec.Struct, kw_only=True):
    """``effort`` caps thinking like OpenAI's ``reasoning_effort``; ``format`` constrains the text to JSON."""

    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: JSONOutputFormat | None = None


class CountTokensRequest(msgspec.Struct, kw_only=True):
    model: str
    messages: list[Message]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None


class MessagesRequest(CountTokensRequest, kw_only=True):
    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None


# ---------------------------------------------------------------- responses


class TextContent(msgspec.Struct, tag_field="type", tag="text", kw_only=True):
    text: str


class ThinkingContent(msgspec.Struct, tag_field="type", tag="thinking", kw_only=True):
    thinking: str
    signature: str = ""


class ToolUseContent(msgspec.Struct, tag_field="type", tag="tool_use", kw_only=True):
    id: str
    name: str
    input: dict[str, Any]


ResponseBlock = TextContent | ThinkingContent | ToolUseContent


class MessageUsage(msgspec.Struct, kw_only=True):
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int = 0


class MessageResponse(msgspec.Struct, tag_field="type", tag="message", kw_only=True):
    id: str
    model: str
    content: list[ResponseBlock]
    stop_reason: str | None
    stop_sequence: str | None
    usage: MessageUsage
    role: str = "assistant"


class TokenCount(msgspec.Struct):
    input_tokens: int


# ---------------------------------------------------------------- stream events


class MessageStart(msgspec.Struct, tag_field="type", tag="message_start"):
    message: MessageResponse


class ContentBlockStart(msgspec.Struct, tag_field="type", tag="content_block_start"):
    index: int
    content_block: ResponseBlock


class TextDelta(msgspec.Struct, tag_field="type", tag="text_delta"):
    text: str


class ThinkingDelta(msgspec.Struct, tag_field="type", tag="thinking_delta"):
    thinking: str


class SignatureDelta(msgspec.Struct, tag_field="type", tag="signature_delta"):
    signature: str


class InputJSONDelta(msgspec.Struct, tag_field="type", tag="input_json_delta"):
    partial_json: str


class ContentBlockDelta(msgspec.Struct, tag_field="type", tag="content_block_delta"):
    index: int
    delta: TextDelta | ThinkingDelta | SignatureDelta | InputJSONDelta


class ContentBlockStop(msgspec.Struct, tag_field="type", tag="content_block_stop"):
    index: int


class Ping(msgspec.Struct, tag_field="type", tag="ping"):
    pass


class StopInfo(msgspec.Struct):
    stop_reason: str | None
    stop_sequence: str | None


class DeltaUsage(msgspec.Struct):
    output_tokens: int


class MessageDelta(msgspec.Struct, tag_field="type", tag="message_delta"):
    delta: StopInfo
    usage: DeltaUsage


class MessageStop(msgspec.Struct, tag_field="type", tag="message_stop"):
    pass
