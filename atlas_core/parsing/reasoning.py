"""Reasoning parsers: split model output into reasoning (between think markers) and content.

Formats are recognised at the start of the output only. Whitespace next to a marker belongs to
the markup: reasoning is trimmed at both ends and content after the closing marker loses its
leading whitespace. A marker split across deltas is held back until it is complete.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from atlas_core.parsing.scan import WhitespaceGate, partial_marker_suffix


@dataclass(frozen=True)
class ReasoningFormat:
    """Markers of one reasoning format, registered under its ``name`` through the
    ``register_reasoning_parsers`` hook. With ``implicit_start`` the output begins inside the
    reasoning even when the opening marker is missing (the chat template wrote it). ``label`` is
    text after ``start`` that belongs to the opening markup (Gemma 4 names its reasoning channel:
    ``<|channel>thought``); grammars and thinking budgets key on ``start`` alone."""

    name: str
    start: str
    end: str
    implicit_start: bool = False
    label: str = ""

    @property
    def opening(self) -> str:
        """The whole opening markup: ``start`` and ``label``."""
        return self.start + self.label

    def opened_by(self, prompt_text: str) -> bool:
        """True when the rendered prompt ends inside an open reasoning block."""
        return prompt_text.rstrip().endswith(self.opening)


QWEN3 = ReasoningFormat("qwen3", "<think>", "</think>")
"""``<think>`` ... ``</think>``, reasoning only when the output (or the prompt) opens the block."""
DEEPSEEK_R1 = ReasoningFormat("deepseek_r1", "<think>", "</think>", implicit_start=True)
"""``<think>`` ... ``</think>``; the output starts inside the reasoning even without ``<think>``."""
MISTRAL = ReasoningFormat("mistral", "[THINK]", "[/THINK]")
"""``[THINK]`` ... ``[/THINK]`` (Magistral; special tokens in Mistral tokenizers)."""

Piece = tuple[bool, str]
"""``(is_reasoning, text)``: one span of output routed to reasoning or to content."""


class _State(enum.Enum):
    OPENING = "opening"  # deciding whether the output starts with the opening marker
    THINKING = "thinking"
    AFTER = "after"  # the block closed; leading whitespace of the content is dropped
    CONTENT = "content"


class ReasoningSplitter:
    """Incremental splitter: `feed` text deltas, then `finish`; each returns `Piece` spans."""

    def __init__(self, fmt: ReasoningFormat, prompt_text: str = "") -> None:
        self.fmt = fmt
        self.thought = fmt.opened_by(prompt_text)
        """True once the output is known to contain reasoning (possibly empty)."""
        self._state = _State.THINKING if self.thought else _State.OPENING
        self._buffer = ""
        self._reasoning = WhitespaceGate(strip_leading=True)

    def feed(self, text: str) -> list[Piece]:
        self._buffer += text
        return self._drain(final=False)

    def finish(self) -> list[Piece]:
        pieces = self._drain(final=True)
        if self._state is _State.THINKING:
            pieces.append((True, self._reasoning.flush()))
        return [p for p in pieces if p[1]]

    def _drain(self, final: bool) -> list[Piece]:
        pieces: list[Piece] = []
        while True:
            if self._state is _State.OPENING:
                stripped = self._buffer.lstrip()
                if stripped.startswith(self.fmt.opening):
                    self._buffer = stripped[len(self.fmt.opening) :]
                    self._enter_thinking()
                elif self.fmt.opening.startswith(stripped) and not final:
                    return pieces
                elif self.fmt.implicit_start:
                    self._enter_thinking()
                else:
                    self._state = _State.CONTENT
            elif self._state is _State.THINKING:
                end = self._buffer.find(self.fmt.end)
                if end < 0:
                    keep = 0 if final else partial_marker_suffix(self._buffer, [self.fmt.end])
                    cut = len(self._buffer) - keep
                    pieces.append((True, self._reasoning.push(self._buffer[:cut])))
                    self._buffer = self._buffer[cut:]
                    return [p for p in pieces if p[1]]
                pieces.append((True, self._reasoning.push(self._buffer[:end])))
                self._reasoning.drop_held()
                self._buffer = self._buffer[end + len(self.fmt.end) :]
                self._state = _State.AFTER
            elif self._state is _State.AFTER:
                self._buffer = self._buffer.lstrip()
                if not self._buffer:
                    return [p for p in pieces if p[1]]
                self._state = _State.CONTENT
            else:
                pieces.append((False, self._buffer))
                self._buffer = ""
                return [p for p in pieces if p[1]]

    def _enter_thinking(self) -> None:
        self.thought = True
        self._state = _State.THINKING
