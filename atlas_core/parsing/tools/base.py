"""What every tool-call format provides: where its markup starts and ends in the output, how a
complete markup region turns into calls, and a grammar that generates the markup.

Formats only read text; resolving tool names and validating arguments is `ToolArguments`' job.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from atlas_core.parsing.types import ToolDefinition


class MarkupError(ValueError):
    """Tool-call markup that cannot be read; the message says what is wrong with it."""


@dataclass(frozen=True)
class RawCall:
    """One call as written by the model. ``arguments`` is the decoded JSON value (normally an
    object; a string holding JSON is decoded later), or, with ``text_values``, an object whose values
    are the raw strings of an XML-style format, converted by the parameter's schema type.
    ``raw`` is the call's own text, kept as content when the call cannot be honoured."""

    name: str
    arguments: Any
    raw: str
    text_values: bool = False


Literal = Callable[[str], str]
"""Renders a fixed piece of markup as a grammar item: a quoted string, or a special-token reference
when the tokenizer has that text as one special token."""


class ToolFormat(ABC):
    """One tool-call markup. A *region* starts with one of ``starts`` and ends with ``end`` (None:
    the region runs to the end of the output); ``anchored`` formats are recognised only at the
    start of the content. Regions may hold several calls."""

    name: ClassVar[str]
    starts: ClassVar[tuple[str, ...]]
    end: ClassVar[str | None]
    anchored: ClassVar[bool] = False

    @abstractmethod
    def parse(self, start: str, body: str) -> list[RawCall] | None:
        """The calls in one region (``start`` is the marker that opened it, ``body`` the text up to
        the end marker). None when the region is ordinary text after all (no problem to report);
        raises `MarkupError` for markup that is meant as calls but cannot be read."""

    @abstractmethod
    def grammar(self, tools: Sequence[ToolDefinition], lit: Literal, parallel: bool) -> str:
        """llguidance Lark rules defining ``calls``: one call of any of ``tools`` in this markup, or
        (``parallel``) one or more."""

    @property
    def markers(self) -> tuple[str, ...]:
        """Every fixed piece of markup, for special-token checks."""
        return (*self.starts, *((self.end,) if self.end else ()))


def decode_json_prefix(text: str, what: str) -> tuple[Any, str]:
    """The JSON value at the start of ``text`` (after whitespace) and the text after it."""
    stripped = text.lstrip()
    try:
        value, end = json.JSONDecoder().raw_decode(stripped)
    except json.JSONDecodeError as e:
        raise MarkupError(f"{what} is not valid JSON ({e.msg} at character {e.pos})") from None
    return value, stripped[end:]


def decode_json(text: str, what: str) -> Any:
    """The single JSON value that is the whole of ``text`` (surrounding whitespace allowed)."""
    value, rest = decode_json_prefix(text, what)
    if rest.strip():
        raise MarkupError(f"{what} has text after its JSON value: {rest.strip()[:40]!r}")
    return value


def calls_from_json(value: Any, what: str) -> list[RawCall]:
    """Calls from ``{"name", "arguments"|"parameters"}`` objects (one, or a list of them)."""
    items = value if isinstance(value, list) else [value]
    if not items:
        raise MarkupError(f"{what} is an empty list")
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise MarkupError(f"{what}: each call must be an object with a string 'name', got {json.dumps(item)[:80]}")
        arguments = item.get("arguments", item.get("parameters", {}))
        calls.append(RawCall(item["name"], arguments, json.dumps(item, ensure_ascii=False)))
    return calls


def json_calls(text: str, what: str) -> list[RawCall]:
    """The calls of ``text`` that is one JSON call object or a list of them (see `calls_from_json`)."""
    return calls_from_json(decode_json(text, what), what)


def is_call_object(value: Any) -> bool:
    """True for a ``{"name": str, "arguments"|"parameters": ...}`` object or a non-empty list of them."""
    items = value if isinstance(value, list) else [value]
    return bool(items) and all(
        isinstance(v, dict) and isinstance(v.get("name"), str) and ("arguments" in v or "parameters" in v)
        for v in items
    )
