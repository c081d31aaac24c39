"""What the output parsers produce: tool definitions and calls, a parsed message, and stream events.

The server turns a completion's text into these, through `atlas_core.parsing.OutputParser` (reasoning
split first, then tool calls), and maps them to OpenAI or Anthropic shapes; nothing here knows HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolDefinition:
    """A function the model may call: name, description and a JSON Schema for its arguments object."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})


@dataclass(frozen=True)
class ToolCall:
    """One call the model made. ``arguments`` is a JSON object text, already validated against the
    tool's schema and coerced where unambiguous; ``id`` is unique per call (``call_...``)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ParsedMessage:
    """A whole assistant turn: visible ``content`` (markup removed), ``reasoning`` (None when the
    model did not think), ``tool_calls`` in order, and ``problems``: sentences about model output
    that could not be honoured (unknown tool, arguments not matching the schema, broken markup), in
    which case the raw text is kept in ``content`` rather than dropped."""

    content: str
    reasoning: str | None
    tool_calls: list[ToolCall]
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    """Call number ``index`` (0-based, in order of appearance) begins: its id and tool name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArgumentsDelta:
    """The next fragment of call ``index``'s arguments JSON text; the fragments of one call
    concatenate to exactly the final `ToolCall.arguments`."""

    index: int
    fragment: str


StreamEvent = ContentDelta | ReasoningDelta | ToolCallStart | ToolCallArgumentsDelta
