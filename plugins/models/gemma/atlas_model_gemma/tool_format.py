"""The Gemma 4 tool-call format (``gemma4``): one region per call, parallel calls written back to back::

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3,options:{hourly:true}}<tool_call|>

Arguments use Gemma's own object syntax, not JSON: keys are bare (``<|"|>``-delimited or
JSON-quoted keys are read too), strings sit between ``<|"|>`` markers and are taken literally
(no escapes: commas, braces and quotes inside need none), numbers, ``true``, ``false`` and
``null`` are bare, and objects and arrays nest with ``{}`` / ``[]``. A JSON-quoted string
(``"text"``) is read as a string as well.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from json.decoder import scanstring  # type: ignore[attr-defined]  # public in CPython, missing from typeshed
from typing import Any

from atlas_core.parsing.tools.base import Literal, MarkupError, RawCall, ToolFormat
from atlas_core.parsing.types import ToolDefinition
from atlas_model_gemma.tool_grammar import STRING_DELIMITER, gemma4_calls_grammar

CALL_START, CALL_END = "<|tool_call>", "<tool_call|>"
_CALL_HEAD = re.compile(r"\s*call:\s*([^{]*?)\s*\{")
_BARE_VALUE = re.compile(r"[^\s,{}\[\]]+")
_BARE_KEY = re.compile(r"[^:,{}\[\]]+")
_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_LITERALS: dict[str, Any] = {"true": True, "false": False, "null": None}


class _ArgumentReader:
    """Recursive-descent reader of Gemma's value syntax over ``text``, from ``pos`` on.
    Positions in error messages count characters of ``text``."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, what: str) -> MarkupError:
        return MarkupError(f"{what} at character {self.pos} of the arguments")

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def expect(self, char: str) -> None:
        self.skip_space()
        if not self.text.startswith(char, self.pos):
            found = repr(self.text[self.pos]) if self.pos < len(self.text) else "the end"
            raise self.fail(f"expected {char!r}, found {found}")
        self.pos += 1

    def value(self) -> Any:
        self.skip_space()
        if self.text.startswith(STRING_DELIMITER, self.pos):
            return self.delimited_string()
        if self.pos >= len(self.text):
            raise self.fail("a value is missing")
        char = self.text[self.pos]
        if char == "{":
            return self.object()
        if char == "[":
            return self.array()
        if char == '"':
            return self.json_string()
        return self.bare_value()

    def delimited_string(self) -> str:
        start = self.pos + len(STRING_DELIMITER)
        end = self.text.find(STRING_DELIMITER, start)
        if end < 0:
            raise self.fail(f"a string opened with {STRING_DELIMITER} is never closed")
        self.pos = end + len(STRING_DELIMITER)
        return self.text[start:end]

    def json_string(self) -> str:
        try:
            value, self.pos = scanstring(self.text, self.pos + 1)
        except json.JSONDecodeError as e:
            raise self.fail(f"a quoted string is not valid JSON ({e.msg})") from None
        return value

    def bare_value(self) -> Any:
        match = _BARE_VALUE.match(self.text, self.pos)
        if match is None:
            raise self.fail(f"expected a value, found {self.text[self.pos]!r}")
        token = match.group(0)
        if token in _LITERALS:
            value = _LITERALS[token]
        elif _NUMBER.fullmatch(token):
            value = json.loads(token)
            if isinstance(value, float) and not math.isfinite(value):
                raise self.fail(f"the number {token!r} is too large")
        else:
            raise self.fail(f"{token!r} is not a number, true, false or null (strings go between {STRING_DELIMITER})")
        self.pos = match.end()
        return value

    def key(self) -> str:
        self.skip_space()
        if self.text.startswith(STRING_DELIMITER, self.pos):
            return self.delimited_string()
        if self.text.startswith('"', self.pos):
            return self.json_string()
        match = _BARE_KEY.match(self.text, self.pos)
        if match is None or not match.group(0).strip():
            raise self.fail("expected a key")
        self.pos = match.end()
        return match.group(0).strip()

    def object(self) -> dict[str, Any]:
        self.expect("{")
        members: dict[str, Any] = {}
        self.skip_space()
        if self.text.startswith("}", self.pos):
            self.pos += 1
            return members
        while True:
            key = self.key()
            if key in members:
                raise self.fail(f"the key {key!r} is given twice")
            self.expect(":")
            members[key] = self.value()
            if not self.separator("}"):
                return members

    def array(self) -> list[Any]:
        self.expect("[")
        items: list[Any] = []
        self.skip_space()
        if self.text.startswith("]", self.pos):
            self.pos += 1
            return items
        while True:
            items.append(self.value())
            if not self.separator("]"):
                return items

    def separator(self, closing: str) -> bool:
        """True after a comma (another item follows); False after ``closing``."""
        self.skip_space()
        char = self.text[self.pos] if self.pos < len(self.text) else ""
        if char not in (",", closing):
            raise self.fail(f"expected ',' or {closing!r}, found {repr(char) if char else 'the end'}")
        self.pos += 1
        return char == ","


def read_gemma4_arguments(text: str) -> tuple[dict[str, Any], str]:
    """The object at the start of ``text`` (``{...}`` in Gemma's syntax) and the text after it.
    `MarkupError` says where the syntax breaks."""
    reader = _ArgumentReader(text)
    value = reader.object()
    return value, text[reader.pos :]


class Gemma4Format(ToolFormat):
    """``<|tool_call>call:NAME{key:value,...}<tool_call|>``, one call per region."""

    name = "gemma4"
    starts = (CALL_START,)
    end = CALL_END

    @property
    def markers(self) -> tuple[str, ...]:
        return (CALL_START, CALL_END, STRING_DELIMITER)

    def parse(self, start: str, body: str) -> list[RawCall]:
        head = _CALL_HEAD.match(body)
        if head is None or not head.group(1):
            raise MarkupError(f"a {CALL_START} must hold call:NAME{{arguments}}")
        name = head.group(1)
        arguments, rest = read_gemma4_arguments(body[head.end() - 1 :])
        if rest.strip():
            raise MarkupError(f"text after the arguments of {name!r}: {rest.strip()[:40]!r}")
        return [RawCall(name, arguments, start + body + CALL_END)]

    def grammar(self, tools: Sequence[ToolDefinition], lit: Literal, parallel: bool) -> str:
        return gemma4_calls_grammar(tools, lit, parallel, CALL_START, CALL_END)
