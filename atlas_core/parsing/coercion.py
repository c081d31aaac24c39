"""Unambiguous conversions of JSON values toward a JSON Schema's declared types.

Only where the schema's type excludes strings: ``"3"`` -> 3 for an integer, ``"2.5"`` -> 2.5 for
a number, ``"true"``/``"false"`` for a boolean, ``"null"`` for null, and a JSON-encoded string for
an object or array; at every depth the schema describes through ``properties``,
``additionalProperties`` and ``items``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

_NOT_CONVERTED = object()
_INTEGER = re.compile(r"-?\d+")


def schema_types(schema: dict[str, Any]) -> set[str]:
    """The JSON types a schema names (``type`` as a string or list; implied object/array)."""
    declared = schema.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return {t for t in declared if isinstance(t, str)}
    if "properties" in schema:
        return {"object"}
    if "items" in schema:
        return {"array"}
    return set()


def _from_string(text: str, types: set[str]) -> Any:
    stripped = text.strip()
    if "integer" in types and _INTEGER.fullmatch(stripped):
        return int(stripped)
    if "number" in types:
        try:
            number = float(stripped)
        except ValueError:
            pass
        else:
            if math.isfinite(number):
                return int(number) if _INTEGER.fullmatch(stripped) else number
    if "boolean" in types and stripped.lower() in ("true", "false"):
        return stripped.lower() == "true"
    if "null" in types and stripped == "null":
        return None
    if types & {"object", "array"}:
        try:
            value = json.loads(stripped)
        except ValueError:
            return _NOT_CONVERTED
        if (isinstance(value, dict) and "object" in types) or (isinstance(value, list) and "array" in types):
            return value
    return _NOT_CONVERTED


def coerce(value: Any, schema: Any) -> Any:
    """``value`` with the unambiguous conversions of the module docstring applied."""
    if not isinstance(schema, dict):
        return value
    types = schema_types(schema)
    if isinstance(value, str) and types and "string" not in types:
        converted = _from_string(value, types)
        if converted is not _NOT_CONVERTED:
            value = converted
    if isinstance(value, dict):
        declared = schema.get("properties")
        properties = declared if isinstance(declared, dict) else {}
        extra = schema.get("additionalProperties")
        return {k: coerce(v, properties.get(k, extra)) for k, v in value.items()}
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [coerce(v, schema["items"]) for v in value]
    return value
