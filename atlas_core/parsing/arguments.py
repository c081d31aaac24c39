"""Tool-call arguments: resolving the tool a call names, coercing values where the schema makes
the meaning unambiguous (`atlas_core.parsing.coercion`), and validating them with `jsonschema`.
XML-style formats deliver every value as a string; the same coercions convert them, and values
of string parameters are kept as written.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence

import jsonschema
from jsonschema.exceptions import best_match
from jsonschema.validators import validator_for

from atlas_core.parsing.coercion import coerce
from atlas_core.parsing.errors import ToolSchemaError
from atlas_core.parsing.tools.base import RawCall
from atlas_core.parsing.types import ToolCall, ToolDefinition


def new_call_id() -> str:
    """A fresh tool-call id, ``call_`` + 24 hex digits (unique per call, as OpenAI's are)."""
    return f"call_{uuid.uuid4().hex[:24]}"


def normalised_name(name: str) -> str:
    """A tool name compared case-, space-, hyphen- and underscore-insensitively."""
    return re.sub(r"[\s_\-]+", "", name).lower()


class ToolArguments:
    """The tools of one request, with a validator per tool; turns `RawCall` into `ToolCall`."""

    def __init__(self, tools: Sequence[ToolDefinition]) -> None:
        self.tools = {tool.name: tool for tool in tools}
        self._by_normalised: dict[str, list[str]] = {}
        for name in self.tools:
            self._by_normalised.setdefault(normalised_name(name), []).append(name)
        self._validators: dict[str, jsonschema.protocols.Validator] = {}
        for tool in tools:
            schema = tool.parameters or {"type": "object"}
            cls = validator_for(schema, default=jsonschema.Draft202012Validator)
            try:
                cls.check_schema(schema)
            except jsonschema.SchemaError as e:
                raise ToolSchemaError(
                    f"tool {tool.name!r}: parameters is not a valid JSON Schema: {e.message}"
                ) from None
            self._validators[tool.name] = cls(schema)

    def resolve_name(self, name: str) -> str | None:
        """The defined tool ``name`` refers to (exactly, or normalised when that is unique)."""
        if name in self.tools:
            return name
        matches = self._by_normalised.get(normalised_name(name), [])
        return matches[0] if len(matches) == 1 else None

    def resolve(self, call: RawCall) -> ToolCall | str:
        """The validated call, or a sentence saying why it cannot be honoured."""
        name = self.resolve_name(call.name)
        if name is None:
            similar = self._by_normalised.get(normalised_name(call.name), [])
            if len(similar) > 1:
                return f"the model called {call.name!r}, which could be any of the tools {', '.join(sorted(similar))}"
            known = ", ".join(sorted(self.tools)) or "none"
            return f"the model called an unknown tool {call.name!r} (tools: {known})"
        arguments = call.arguments
        if arguments is None:
            arguments = {}
        if isinstance(arguments, str) and not call.text_values:
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                return f"the arguments of the call to {name!r} are a string that is not JSON: {arguments[:60]!r}"
        if not isinstance(arguments, dict):
            return f"the arguments of the call to {name!r} are not a JSON object: {json.dumps(arguments)[:60]}"
        schema = self.tools[name].parameters or {}
        arguments = coerce(arguments, schema)
        error = best_match(self._validators[name].iter_errors(arguments))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "the arguments object"
            return f"the arguments of the call to {name!r} do not match its schema at {where}: {error.message}"
        return ToolCall(new_call_id(), name, json.dumps(arguments, ensure_ascii=False))
