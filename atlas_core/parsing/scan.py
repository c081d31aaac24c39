"""Text scanning helpers shared by the streaming parsers: markers that may arrive split across
deltas, and whitespace held back until it is known whether it touches markup."""

from __future__ import annotations

from collections.abc import Iterable


def partial_marker_suffix(text: str, markers: Iterable[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``markers``
    (text that must be held back because the next delta may complete a marker)."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest


def find_marker(text: str, markers: Iterable[str], start: int = 0) -> tuple[int, str] | None:
    """The earliest occurrence ``(index, marker)`` of any marker in ``text[start:]`` (the longest
    marker wins a tie), or None."""
    best: tuple[int, str] | None = None
    for marker in markers:
        index = text.find(marker, start)
        if index >= 0 and (best is None or index < best[0] or (index == best[0] and len(marker) > len(best[1]))):
            best = (index, marker)
    return best


class WhitespaceGate:
    """Passes text through, holding back trailing whitespace until more text follows.

    Whitespace next to markup is not content. `drop_held` discards the held whitespace (markup
    follows it). `markup` marks a span replaced by markup: the whitespace on both sides of it
    collapses to one separator, kept only between two pieces of content (the whitespace before
    the markup, or else the whitespace after it) and dropped at either end of the content.
    """

    def __init__(self, *, strip_leading: bool = False) -> None:
        self._held = ""
        self._strip_leading = strip_leading
        self._gap = ""
        self._emitted = False

    def push(self, text: str) -> str:
        """Newly visible text for ``text``."""
        if self._strip_leading:
            stripped = text.lstrip()
            self._gap = self._gap or text[: len(text) - len(stripped)]
            if not stripped:
                return ""
            text = (self._gap if self._emitted else "") + stripped
            self._strip_leading, self._gap = False, ""
        combined = self._held + text
        visible = combined.rstrip()
        self._held = combined[len(visible) :]
        self._emitted = self._emitted or bool(visible)
        return visible

    def drop_held(self) -> None:
        self._held = ""

    def markup(self) -> None:
        if not self._strip_leading:
            self._gap, self._strip_leading = self._held, True
        self._held = ""

    def flush(self) -> str:
        """The held whitespace, released (the text ended without markup after it)."""
        held, self._held = self._held, ""
        return held
