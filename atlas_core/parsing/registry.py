"""Parser names: the tool-call formats and reasoning formats a request or a family can select."""

from __future__ import annotations

from atlas_core.parsing.errors import UnknownParserError
from atlas_core.parsing.reasoning import REASONING_FORMATS, ReasoningFormat
from atlas_core.parsing.tools import TOOL_FORMATS, ToolFormat


def tool_parser_names() -> list[str]:
    """The valid ``tool_call_parser`` names."""
    return sorted(TOOL_FORMATS)


def reasoning_parser_names() -> list[str]:
    """The valid ``reasoning_parser`` names."""
    return sorted(REASONING_FORMATS)


def tool_format(name: str) -> ToolFormat:
    """The tool-call format called ``name``; `UnknownParserError` lists the valid names otherwise."""
    try:
        return TOOL_FORMATS[name]
    except KeyError:
        raise UnknownParserError(
            f"unknown tool-call parser {name!r}; valid names: {', '.join(tool_parser_names())}"
        ) from None


def reasoning_format(name: str) -> ReasoningFormat:
    """The reasoning format called ``name``; `UnknownParserError` lists the valid names otherwise."""
    try:
        return REASONING_FORMATS[name]
    except KeyError:
        raise UnknownParserError(
            f"unknown reasoning parser {name!r}; valid names: {', '.join(reasoning_parser_names())}"
        ) from None
