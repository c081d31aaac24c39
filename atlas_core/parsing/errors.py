"""Errors of the output-parsing layer; both are request errors (HTTP 400) and `ValueError`s."""

from __future__ import annotations

from atlas_core.errors import InvalidRequestError


class UnknownParserError(InvalidRequestError, ValueError):
    """A tool-call or reasoning parser name that no parser has; the message lists the valid names."""


class ToolSchemaError(InvalidRequestError, ValueError):
    """A tool definition or ``tool_choice`` that cannot be used (e.g. parameters not a JSON Schema)."""
