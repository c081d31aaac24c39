"""Checks for tool-call and reasoning formats, core's or a plugin's (`docs/plugin-hooks.md`).

A format's tests script model outputs as `ToolCallCase`s and check them with `check_tool_case`
(parsed whole, and streamed one character at a time, they give the expected content, calls and
problems) and reasoning outputs with `check_reasoning_case`; `check_streams_like_whole` checks that
any split of a text into deltas streams events that add up to the message of the whole text. The
cases call `TOOLS`. Grammar checks are in `atlas_core.testing.grammars`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from atlas_core.parsing import (
    ContentDelta,
    OutputParser,
    ParsedMessage,
    ReasoningDelta,
    StreamEvent,
    ToolCallArgumentsDelta,
    ToolCallStart,
    ToolDefinition,
)

WEATHER = ToolDefinition(
    "get_weather",
    "Current weather for a city",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "metric": {"type": "boolean"},
            "options": {"type": "object", "properties": {"hourly": {"type": "boolean"}}},
        },
        "required": ["city"],
    },
)
TIME = ToolDefinition(
    "get_time", "Current time", {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}
)
TOOLS = [WEATHER, TIME]
"""The tools every scripted case may call."""

PARIS = ("get_weather", {"city": "Paris"})
ROME3 = ("get_weather", {"city": "Rome", "days": 3})
UTC = ("get_time", {"zone": "UTC"})


class ToolCallCase(NamedTuple):
    """A scripted model output in the markup of tool-call parser ``parser``, and what parsing it gives:
    the visible ``content``, the ``calls`` as (name, arguments object) pairs, and ``problems``, one
    substring per expected problem."""

    id: str
    parser: str
    text: str
    content: str
    calls: list[tuple[str, dict[str, Any]]]
    problems: tuple[str, ...] = ()


def stream(text_pieces: Iterable[str], **parser_args: Any) -> tuple[list[StreamEvent], ParsedMessage]:
    """Feed the pieces one by one; all events and the final message."""
    parser = OutputParser(**parser_args)
    events: list[StreamEvent] = []
    for piece in text_pieces:
        events += parser.feed(piece)
    tail, message = parser.finish()
    return events + tail, message


def summary(events: list[StreamEvent]) -> list[tuple[Any, ...]]:
    """Events with adjacent text deltas and argument fragments merged and call ids dropped: tuples of
    the event kind (a str) and its fields."""
    merged: list[list[Any]] = []
    for event in events:
        if isinstance(event, ContentDelta | ReasoningDelta):
            kind = type(event).__name__
            if merged and merged[-1][0] == kind:
                merged[-1][1] += event.text
            else:
                merged.append([kind, event.text])
        elif isinstance(event, ToolCallStart):
            merged.append(["start", event.index, event.name])
        elif isinstance(event, ToolCallArgumentsDelta):
            if merged and merged[-1][0] == "args" and merged[-1][1] == event.index:
                merged[-1][2] += event.fragment
            else:
                merged.append(["args", event.index, event.fragment])
    return [tuple(m) for m in merged]


def without_ids(message: ParsedMessage) -> tuple[Any, ...]:
    return (
        message.content,
        message.reasoning,
        [(c.name, c.arguments) for c in message.tool_calls],
        message.problems,
    )


def check_consistent(events: list[StreamEvent], message: ParsedMessage) -> None:
    """The streamed events add up to the message: content, reasoning, calls in order, arguments."""
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == message.content
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    assert reasoning == (message.reasoning or "")
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    assert [(s.index, s.id, s.name) for s in starts] == [(i, c.id, c.name) for i, c in enumerate(message.tool_calls)]
    for i, call in enumerate(message.tool_calls):
        fragments = [e.fragment for e in events if isinstance(e, ToolCallArgumentsDelta) and e.index == i]
        assert "".join(fragments) == call.arguments
    assert all(not isinstance(e, ContentDelta) or e.text for e in events), "no empty deltas"


def split(text: str, cuts: Iterable[int]) -> list[str]:
    """``text`` cut at each of ``cuts`` (taken modulo ``len(text) + 1``); the pieces join to ``text``."""
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


def check_streams_like_whole(pieces: Sequence[str], **parser_args: Any) -> ParsedMessage:
    """Streaming ``pieces`` gives the same message and merged events as parsing their join whole,
    and the events add up to the message; returns the streamed message."""
    whole_events, whole = stream(["".join(pieces)], **parser_args)
    events, message = stream(pieces, **parser_args)
    assert without_ids(message) == without_ids(whole)
    assert summary(events) == summary(whole_events)
    check_consistent(events, message)
    return message


def check_tool_case(case: ToolCallCase) -> None:
    """Parsed whole, ``case.text`` gives the case's content, calls (with distinct fresh ``call_`` ids)
    and problems, and no reasoning; streamed one character at a time, the same message."""
    message = OutputParser.parse(case.text, tool_parser=case.parser, tools=TOOLS)
    assert message.content == case.content
    assert [(c.name, json.loads(c.arguments)) for c in message.tool_calls] == case.calls
    assert len(message.problems) == len(case.problems), message.problems
    for problem, words in zip(message.problems, case.problems, strict=True):
        assert words in problem
    assert len({c.id for c in message.tool_calls}) == len(message.tool_calls)
    assert all(c.id.startswith("call_") for c in message.tool_calls)
    assert message.reasoning is None
    check_streams_like_whole(list(case.text), tool_parser=case.parser, tools=TOOLS)


def check_reasoning_case(parser: str, prompt: str, output: str, reasoning: str | None, content: str) -> None:
    """``output`` of a ``prompt`` splits into ``reasoning`` (None: the model did not think) and
    ``content`` with reasoning parser ``parser``, whole and streamed one character at a time."""
    message = OutputParser.parse(output, reasoning_parser=parser, prompt_text=prompt)
    assert (message.reasoning, message.content) == (reasoning, content)
    streamed = check_streams_like_whole(list(output), reasoning_parser=parser, prompt_text=prompt)
    assert without_ids(streamed) == without_ids(message)
