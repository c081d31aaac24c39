"""A completion's parser events -> Responses output items and their stream events.

`OutputItems` is the one place that turns `atlas_core.parsing` events into ``reasoning``,
``message`` and ``function_call`` items: a run of reasoning deltas is one reasoning item, a run of
content deltas one message with one ``output_text`` part, each tool call one ``function_call``
item. A streamed response sends the events it returns; a whole response feeds the completion's
text at once and keeps only the items, so both carry the same output.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from atlas_core.parsing.types import ContentDelta, ReasoningDelta, StreamEvent, ToolCallArgumentsDelta, ToolCallStart
from atlas_core.server.schemas_responses import (
    ArgumentsDelta,
    ArgumentsDone,
    ContentPartAdded,
    ContentPartDone,
    FunctionCallItem,
    ItemEvent,
    ItemStatus,
    MessageItem,
    OutputItem,
    OutputItemAdded,
    OutputItemDone,
    OutputText,
    OutputTextDelta,
    OutputTextDone,
    ReasoningItem,
    ReasoningText,
    ReasoningTextDelta,
    ReasoningTextDone,
)


def new_id(prefix: str) -> str:
    """A fresh id such as ``resp_…``, ``msg_…``, ``rs_…`` or ``fc_…``."""
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class _Open:
    """The item being written: its kind (``message``, ``reasoning`` or ``("call", index)``), its
    position in the output, id, and text (or arguments) so far."""

    kind: object
    index: int
    item_id: str
    text: str = ""
    call_id: str = ""
    name: str = ""


@dataclass
class OutputItems:
    """Builds the output items of one completion from its parser events (see the module docstring)."""

    items: list[OutputItem] = field(default_factory=list)
    reasoning: str = ""
    _open: _Open | None = None

    def feed(self, events: list[StreamEvent]) -> list[ItemEvent]:
        """The item events for ``events`` (item opened and closed as the kind of output changes)."""
        out: list[ItemEvent] = []
        for event in events:
            if isinstance(event, ContentDelta):
                out += self._switch("message")
                out += self._append(event.text)
            elif isinstance(event, ReasoningDelta):
                out += self._switch("reasoning")
                out += self._append(event.text)
            elif isinstance(event, ToolCallStart):
                out += self._switch(("call", event.index), call_id=event.id, name=event.name)
            elif isinstance(event, ToolCallArgumentsDelta) and self._open and self._open.kind == ("call", event.index):
                out += self._append(event.fragment)
        return out

    def finish(self, incomplete: bool) -> list[ItemEvent]:
        """Close the open item (``incomplete``: it was cut off by the token limit); a completion that
        wrote nothing at all still answers with an empty message."""
        if self._open is None and not self.items:
            out = self._switch("message")
        else:
            out = []
        return out + self._close("incomplete" if incomplete else "completed")

    @property
    def called_tools(self) -> bool:
        return any(isinstance(item, FunctionCallItem) for item in self.items)

    def _switch(self, kind: object, *, call_id: str = "", name: str = "") -> list[ItemEvent]:
        if self._open is not None and self._open.kind == kind:
            return []
        out = self._close("completed")
        index = len(self.items)
        if kind == "message":
            item: OutputItem = MessageItem(id=new_id("msg"), status="in_progress", content=[])
            part: OutputText | ReasoningText | None = OutputText(text="")
        elif kind == "reasoning":
            item = ReasoningItem(id=new_id("rs"), status="in_progress", content=[])
            part = ReasoningText(text="")
        else:
            item = FunctionCallItem(id=new_id("fc"), call_id=call_id, name=name, arguments="", status="in_progress")
            part = None
        self._open = _Open(kind, index, item.id, call_id=call_id, name=name)
        self.items.append(item)
        out.append(OutputItemAdded(output_index=index, item=item))
        if part is not None:
            out.append(ContentPartAdded(item_id=item.id, output_index=index, content_index=0, part=part))
        return out

    def _append(self, text: str) -> list[ItemEvent]:
        current = self._open
        assert current is not None
        current.text += text
        if current.kind == "message":
            return [OutputTextDelta(item_id=current.item_id, output_index=current.index, content_index=0, delta=text)]
        if current.kind == "reasoning":
            self.reasoning += text
            return [
                ReasoningTextDelta(item_id=current.item_id, output_index=current.index, content_index=0, delta=text)
            ]
        return [ArgumentsDelta(item_id=current.item_id, output_index=current.index, delta=text)]

    def _close(self, status: ItemStatus) -> list[ItemEvent]:
        current = self._open
        if current is None:
            return []
        self._open = None
        item_id, index = current.item_id, current.index
        done: OutputItem
        out: list[ItemEvent]
        if current.kind == "message":
            text = OutputText(text=current.text)
            done = MessageItem(id=current.item_id, status=status, content=[text])
            out = [
                OutputTextDone(item_id=item_id, output_index=index, content_index=0, text=current.text),
                ContentPartDone(item_id=item_id, output_index=index, content_index=0, part=text),
            ]
        elif current.kind == "reasoning":
            reasoning = ReasoningText(text=current.text)
            done = ReasoningItem(id=current.item_id, status=status, content=[reasoning])
            out = [
                ReasoningTextDone(item_id=item_id, output_index=index, content_index=0, text=current.text),
                ContentPartDone(item_id=item_id, output_index=index, content_index=0, part=reasoning),
            ]
        else:
            done = FunctionCallItem(
                id=current.item_id,
                call_id=current.call_id,
                name=current.name,
                arguments=current.text,
                status=status,
            )
            out = [ArgumentsDone(item_id=item_id, output_index=index, name=current.name, arguments=current.text)]
        self.items[current.index] = done
        return [*out, OutputItemDone(output_index=current.index, item=done)]


def assistant_turn(items: list[OutputItem]) -> list[dict[str, object]]:
    """The output as chat-template messages (one assistant turn: text, reasoning, tool calls), kept
    so that a later ``previous_response_id`` continues the conversation."""
    content = "".join(part.text for item in items if isinstance(item, MessageItem) for part in item.content)
    reasoning = "".join(part.text for item in items if isinstance(item, ReasoningItem) for part in item.content)
    turn: dict[str, object] = {"role": "assistant", "content": content}
    if reasoning:
        turn["reasoning_content"] = reasoning
    calls = [
        {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
        for item in items
        if isinstance(item, FunctionCallItem)
    ]
    if calls:
        turn["tool_calls"] = calls
    return [turn]
