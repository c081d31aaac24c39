"""`OutputParser`: one assistant turn's text -> reasoning, content and tool calls, streamed or whole."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from atlas_core.parsing.arguments import ToolArguments
from atlas_core.parsing.errors import ToolSchemaError
from atlas_core.parsing.reasoning import Piece, ReasoningSplitter
from atlas_core.parsing.registry import reasoning_format, tool_format
from atlas_core.parsing.tool_stream import ToolCallScanner
from atlas_core.parsing.types import ContentDelta, ParsedMessage, ReasoningDelta, StreamEvent, ToolDefinition

ToolChoice = str | Mapping[str, Any]
"""``"auto"``, ``"none"``, ``"required"``, or a named function: ``{"name": ...}`` (the OpenAI form
``{"type": "function", "function": {"name": ...}}`` is accepted too)."""


def tool_choice_name(tool_choice: ToolChoice) -> str | None:
    """The function a named ``tool_choice`` forces, or None for the string forms.
    Raises `ToolSchemaError` for a value that is neither."""
    if isinstance(tool_choice, str):
        if tool_choice not in ("auto", "none", "required"):
            raise ToolSchemaError(
                f"tool_choice must be 'auto', 'none', 'required' or a named function, got {tool_choice!r}"
            )
        return None
    function = tool_choice.get("function", tool_choice)
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str) or not name:
        raise ToolSchemaError(f"a named tool_choice needs a function name, got {dict(tool_choice)!r}")
    return name


class OutputParser:
    """Splits a completion into reasoning, content and tool calls.

    ``reasoning_parser`` / ``tool_parser``: names from `reasoning_parser_names` /
    `tool_parser_names`, or None for no such parsing (`UnknownParserError` for a bad name).
    ``tools``: the request's tools; calls are resolved and validated against them. ``prompt_text``:
    the rendered prompt, to know whether the template already opened the reasoning block.
    ``tool_choice``: ``"none"`` (or no tools) turns call parsing off, so markup stays content;
    ``"required"`` records a problem when the turn makes no call; a named function only allows that
    function (`ToolSchemaError` when no tool has that name).

    Streaming: `feed` each text delta, then `finish` once. Markup never reaches `ContentDelta`
    (a marker split across deltas is held back until complete); whitespace next to markup is
    dropped. A tool call is announced (`ToolCallStart`, then its arguments as one
    `ToolCallArgumentsDelta`) when its markup is complete and its arguments validated; a call that
    cannot be honoured stays in the content, and `ParsedMessage.problems` says why. Concatenating
    the streamed events gives exactly the `ParsedMessage` that `finish` returns, and `parse` of the
    whole text gives the same message (call ids aside: they are fresh per parser).
    """

    def __init__(
        self,
        reasoning_parser: str | None = None,
        tool_parser: str | None = None,
        tools: Sequence[ToolDefinition] = (),
        prompt_text: str = "",
        tool_choice: ToolChoice = "auto",
    ) -> None:
        forced = tool_choice_name(tool_choice)
        self.tool_choice = tool_choice
        self._splitter = (
            ReasoningSplitter(reasoning_format(reasoning_parser), prompt_text) if reasoning_parser else None
        )
        fmt = tool_format(tool_parser) if tool_parser else None
        self._scanner: ToolCallScanner | None = None
        if fmt is not None and tools and tool_choice != "none":
            arguments = ToolArguments(tools)
            if forced is not None and forced not in arguments.tools:
                raise ToolSchemaError(f"tool_choice names the function {forced!r}, but no tool of that name was given")
            allowed = None if forced is None else (lambda name: name == forced)
            self._scanner = ToolCallScanner(fmt, arguments, allowed)
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._finished = False

    @property
    def parses_tool_calls(self) -> bool:
        """True when tool-call markup is parsed (a tool parser, tools, and tool_choice not "none")."""
        return self._scanner is not None

    def feed(self, text: str) -> list[StreamEvent]:
        """Events for the next delta of generated text."""
        if self._finished:
            raise RuntimeError("OutputParser.feed after finish")
        pieces = self._splitter.feed(text) if self._splitter else [(False, text)]
        return self._route(pieces)

    def finish(self) -> tuple[list[StreamEvent], ParsedMessage]:
        """Events for the text still held back, and the whole turn as a `ParsedMessage`."""
        if self._finished:
            raise RuntimeError("OutputParser.finish called twice")
        self._finished = True
        events = self._route(self._splitter.finish()) if self._splitter else []
        problems: list[str] = []
        calls = []
        if self._scanner is not None:
            events += self._record(self._scanner.finish())
            problems, calls = self._scanner.problems, self._scanner.calls
            if self.tool_choice != "auto" and not calls:
                problems = [*problems, "tool_choice requires a tool call, but the model made none"]
        thought = self._splitter is not None and self._splitter.thought
        message = ParsedMessage(
            content="".join(self._content),
            reasoning="".join(self._reasoning) if thought else None,
            tool_calls=list(calls),
            problems=list(problems),
        )
        return events, message

    @classmethod
    def parse(
        cls,
        text: str,
        reasoning_parser: str | None = None,
        tool_parser: str | None = None,
        tools: Sequence[ToolDefinition] = (),
        prompt_text: str = "",
        tool_choice: ToolChoice = "auto",
    ) -> ParsedMessage:
        """The `ParsedMessage` of a whole completion (the same as `feed` + `finish`)."""
        parser = cls(reasoning_parser, tool_parser, tools, prompt_text, tool_choice)
        parser.feed(text)
        return parser.finish()[1]

    def _route(self, pieces: list[Piece]) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        for is_reasoning, text in pieces:
            if is_reasoning:
                events.append(ReasoningDelta(text))
            elif self._scanner is not None:
                events += self._scanner.feed(text)
            else:
                events.append(ContentDelta(text))
        return self._record(events)

    def _record(self, events: list[StreamEvent]) -> list[StreamEvent]:
        for event in events:
            if isinstance(event, ContentDelta):
                self._content.append(event.text)
            elif isinstance(event, ReasoningDelta):
                self._reasoning.append(event.text)
        return events
