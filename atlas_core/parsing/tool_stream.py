"""Incremental extraction of tool calls from content text.

Content before, between and after calls streams as it arrives, except text that may be the start
of a call marker (held until it is known) and whitespace next to call markup (dropped). A call is
announced once its markup region is complete and its arguments are validated, so an announced call
is never retracted: a region that cannot be honoured is content instead, with a problem recorded.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from atlas_core.parsing.arguments import ToolArguments
from atlas_core.parsing.scan import WhitespaceGate, find_marker, partial_marker_suffix
from atlas_core.parsing.tools import MarkupError, ToolFormat
from atlas_core.parsing.types import ContentDelta, StreamEvent, ToolCall, ToolCallArgumentsDelta, ToolCallStart


class _State(enum.Enum):
    LEAD = "lead"  # anchored formats: deciding whether the content starts with a marker
    TEXT = "text"
    REGION = "region"


class ToolCallScanner:
    """Feed content text; get content deltas and tool-call events. ``calls`` and ``problems``
    accumulate; `finish` flushes held text and closes an unterminated region."""

    def __init__(self, fmt: ToolFormat, arguments: ToolArguments, allowed: Callable[[str], bool] | None = None) -> None:
        self.fmt = fmt
        self.arguments = arguments
        self.allowed = allowed
        self.calls: list[ToolCall] = []
        self.problems: list[str] = []
        self._state = _State.LEAD if fmt.anchored else _State.TEXT
        self._starts = () if fmt.anchored else fmt.starts
        self._buffer = ""
        self._marker = ""
        self._gate = WhitespaceGate()

    def feed(self, text: str) -> list[StreamEvent]:
        self._buffer += text
        return self._drain(final=False)

    def finish(self) -> list[StreamEvent]:
        events = self._drain(final=True)
        if self._state is _State.REGION:
            body, self._buffer = self._buffer, ""
            events += self._close(body, closed=False)
        return events + self._content(self._gate.flush(), gated=False)

    def _drain(self, final: bool) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        while True:
            if self._state is _State.LEAD:
                stripped = self._buffer.lstrip()
                marker = next(
                    (m for m in sorted(self.fmt.starts, key=len, reverse=True) if stripped.startswith(m)), None
                )
                if marker is not None:
                    self._open(marker, stripped[len(marker) :])
                elif not final and any(m.startswith(stripped) for m in self.fmt.starts):
                    return events
                else:
                    self._state = _State.TEXT
            elif self._state is _State.TEXT:
                found = find_marker(self._buffer, self._starts)
                if found is None:
                    keep = 0 if final else partial_marker_suffix(self._buffer, self._starts)
                    cut = len(self._buffer) - keep
                    events += self._content(self._buffer[:cut])
                    self._buffer = self._buffer[cut:]
                    return events
                index, marker = found
                events += self._content(self._buffer[:index])
                self._open(marker, self._buffer[index + len(marker) :])
            else:
                end = self._buffer.find(self.fmt.end) if self.fmt.end else -1
                if end < 0:
                    return events
                body = self._buffer[:end]
                self._buffer = self._buffer[end + len(self.fmt.end or "") :]
                self._state = _State.TEXT
                events += self._close(body, closed=True)

    def _open(self, marker: str, rest: str) -> None:
        self._marker, self._buffer, self._state = marker, rest, _State.REGION

    def _close(self, body: str, closed: bool) -> list[StreamEvent]:
        raw = self._marker + body + (self.fmt.end or "" if closed else "")
        try:
            raw_calls = self.fmt.parse(self._marker, body)
        except MarkupError as e:
            unclosed = "" if closed or self.fmt.end is None else f" (the output ended before {self.fmt.end})"
            self.problems.append(f"unreadable {self.fmt.name} tool-call markup{unclosed}: {e}")
            return self._content(raw)
        if raw_calls is None:
            return self._content(raw)
        events: list[StreamEvent] = []
        honoured = False
        for raw_call in raw_calls:
            call = self.arguments.resolve(raw_call)
            if isinstance(call, str) or (self.allowed is not None and not self.allowed(call.name)):
                self.problems.append(
                    call if isinstance(call, str) else f"tool_choice does not allow calling {call.name!r}"
                )
                events += self._content(raw_call.raw if honoured or len(raw_calls) > 1 else raw)
                continue
            if not honoured:
                self._gate.markup()
                honoured = True
            index = len(self.calls)
            self.calls.append(call)
            events += [ToolCallStart(index, call.id, call.name), ToolCallArgumentsDelta(index, call.arguments)]
        return events

    def _content(self, text: str, *, gated: bool = True) -> list[StreamEvent]:
        visible = self._gate.push(text) if gated else text
        return [ContentDelta(visible)] if visible else []
