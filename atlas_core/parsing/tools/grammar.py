"""Building blocks of the llguidance Lark grammars that generate tool-call markup."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from atlas_core.parsing.coercion import schema_types
from atlas_core.parsing.structured import json_schema_rule
from atlas_core.parsing.tools.base import Literal
from atlas_core.parsing.types import ToolDefinition


def quoted(text: str) -> str:
    """``text`` as a Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def json_rule(schema: Any) -> str:
    """An inline JSON Schema item (``%json {...}``) laid out on one line; keywords llguidance
    cannot enforce are ignored (arguments are validated after parsing anyway)."""
    return json_schema_rule(schema if isinstance(schema, dict) else {}, "a tool's parameters", lenient=True)


def parameters(tool: ToolDefinition) -> dict[str, Any]:
    """The tool's parameters schema; any object when it gives none."""
    return tool.parameters or {"type": "object"}


def call_object_schema(tools: Sequence[ToolDefinition], arguments_key: str = "arguments") -> dict[str, Any]:
    """Schema of one ``{"name": ..., "arguments": {...}}`` object naming any of ``tools``."""
    variants = [
        {
            "type": "object",
            "properties": {"name": {"const": tool.name}, arguments_key: parameters(tool)},
            "required": ["name", arguments_key],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


def call_list_schema(tools: Sequence[ToolDefinition], parallel: bool) -> dict[str, Any]:
    """Schema of a non-empty list of call objects (exactly one unless ``parallel``)."""
    schema = {"type": "array", "items": call_object_schema(tools), "minItems": 1}
    return schema if parallel else {**schema, "maxItems": 1}


SCALAR_VALUES = {
    "integer": "/-?(0|[1-9][0-9]*)/",
    "number": "/-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?/",
    "boolean": '("true" | "false")',
    "null": '"null"',
}
"""Grammar items for a JSON scalar of each schema type, as XML-style and Gemma 4 formats write them."""


def xml_parameter_rules(
    prefix: str, tool: ToolDefinition, open_parameter: str, close_parameter: str, lit: Literal
) -> tuple[str, list[str]]:
    """Rules for the parameters of ``tool`` in an XML-style format: each parameter is
    ``open_parameter.format(name=...)`` VALUE ``close_parameter``; values of string parameters are
    free text (one of the raw values for an enum or const), numbers and booleans as written in
    JSON, anything else a JSON value of its schema.
    Returns (the sequence of parameter items, required ones mandatory, in schema order; the rules)."""
    schema = parameters(tool)
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    items, rules = [], []
    for i, (name, subschema) in enumerate(properties.items()):
        rule = f"{prefix}_p{i}"
        types = schema_types(subschema) if isinstance(subschema, dict) else set()
        choices = (
            subschema.get("enum", [subschema["const"]] if "const" in subschema else None)
            if types == {"string"}
            else None
        )
        if choices is not None:  # raw text, as string values are written in these formats
            alternatives = " | ".join(quoted(str(c)) for c in choices)
            rules.append(f"{rule}: {lit(open_parameter.format(name=name))} ({alternatives}) {lit(close_parameter)}")
        elif types == {"string"}:
            value = f"{rule}_v"
            rules.append(f"{value}[suffix={quoted(close_parameter)}]: /(?s:.*)/")
            rules.append(f"{rule}: {lit(open_parameter.format(name=name))} {value}")
        else:
            scalar = SCALAR_VALUES.get(next(iter(types))) if len(types) == 1 else None
            value = scalar or json_rule(subschema if isinstance(subschema, dict) else {})
            rules.append(f"{rule}: {lit(open_parameter.format(name=name))} {value} {lit(close_parameter)}")
        items.append(rule if name in required else f"{rule}?")
    return " ".join(items), rules
