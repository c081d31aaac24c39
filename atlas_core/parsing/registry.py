"""Parser names: the tool-call formats and reasoning formats a request or a family can select."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from atlas_core.parsing.errors import UnknownParserError
from atlas_core.parsing.reasoning import REASONING_FORMATS, ReasoningFormat
from atlas_core.parsing.tools import TOOL_FORMATS, ToolFormat

_Format = TypeVar("_Format")


def tool_parser_names() -> list[str]:
    """The valid ``tool_call_parser`` names."""
    return sorted(TOOL_FORMATS)


def reasoning_parser_names() -> list[str]:
    """The valid ``reasoning_parser`` names."""
    return sorted(REASONING_FORMATS)


def tool_format(name: str) -> ToolFormat:
    """The tool-call format called ``name``; `UnknownParserError` lists the valid names otherwise."""
    return _lookup(TOOL_FORMATS, name, "tool-call")


def reasoning_format(name: str) -> ReasoningFormat:
    """The reasoning format called ``name``; `UnknownParserError` lists the valid names otherwise."""
    return _lookup(REASONING_FORMATS, name, "reasoning")


def _lookup(formats: Mapping[str, _Format], name: str, kind: str) -> _Format:
    try:
        return formats[name]
    except KeyError:
        raise UnknownParserError(f"unknown {kind} parser {name!r}; valid names: {', '.join(sorted(formats))}") from None
