"""Parser names: the tool-call and reasoning formats a request or a family can select.

Formats are plugin registrations (hooks ``register_tool_parsers`` and ``register_reasoning_parsers``)
in the process-wide registry (`atlas_core.plugins.get_registry`); a format's module is imported
when its name is first looked up.
"""

from __future__ import annotations

from typing import TypeVar

from atlas_core.errors import PluginError
from atlas_core.parsing.errors import UnknownParserError
from atlas_core.parsing.reasoning import ReasoningFormat
from atlas_core.parsing.tools.base import ToolFormat
from atlas_core.plugins import KIND_LABELS, Registration, get_registry

TOOL_PARSER, REASONING_PARSER = "tool_parser", "reasoning_parser"
"""The registry kinds of the two hooks."""

_Format = TypeVar("_Format", ToolFormat, ReasoningFormat)


def tool_parser_names() -> list[str]:
    """The valid ``tool_call_parser`` names: every registered tool-call format."""
    return get_registry().names(TOOL_PARSER)


def reasoning_parser_names() -> list[str]:
    """The valid ``reasoning_parser`` names: every registered reasoning format."""
    return get_registry().names(REASONING_PARSER)


def tool_format(name: str) -> ToolFormat:
    """The tool-call format registered as ``name``: `UnknownParserError` lists the registered names
    when none has it; otherwise as `load_tool_format`."""
    return load_tool_format(_registered(TOOL_PARSER, name))


def reasoning_format(name: str) -> ReasoningFormat:
    """The reasoning format registered as ``name``: `UnknownParserError` lists the registered names
    when none has it; otherwise as `load_reasoning_format`."""
    return load_reasoning_format(_registered(REASONING_PARSER, name))


def load_tool_format(registration: Registration) -> ToolFormat:
    """A new instance of a tool-call registration's target; `PluginError` when the target cannot
    be imported, is not a `ToolFormat` subclass, or names itself otherwise than it is registered."""
    target = registration.load()
    if not (isinstance(target, type) and issubclass(target, ToolFormat)):
        raise _bad_target(registration, "is not a subclass of atlas_core.parsing.tools.base.ToolFormat")
    return _named(registration, target())


def load_reasoning_format(registration: Registration) -> ReasoningFormat:
    """A reasoning registration's target; `PluginError` when it cannot be imported, is not a
    `ReasoningFormat` instance, or names itself otherwise than it is registered."""
    target = registration.load()
    if not isinstance(target, ReasoningFormat):
        raise _bad_target(registration, "is not an instance of atlas_core.parsing.reasoning.ReasoningFormat")
    return _named(registration, target)


def _registered(kind: str, name: str) -> Registration:
    registry = get_registry()
    registration = registry.find(kind, name)
    if registration is None:
        raise UnknownParserError(
            f"unknown {KIND_LABELS[kind]} {name!r}; valid names: {', '.join(registry.names(kind)) or 'none'} "
            "(plugins register them: `atlas plugins` lists which)"
        )
    return registration


def _bad_target(registration: Registration, problem: str) -> PluginError:
    return PluginError(
        f"{KIND_LABELS[registration.kind]} {registration.name!r} from {registration.plugin.label}: "
        f"{registration.target} {problem}"
    )


def _named(registration: Registration, fmt: _Format) -> _Format:
    if fmt.name != registration.name:
        raise _bad_target(registration, f"is named {fmt.name!r}; its name must be the registered one")
    return fmt
