"""llguidance Lark rules that generate Gemma 4 tool calls with arguments matching each tool's
JSON Schema, in Gemma's object syntax (see `atlas_model_gemma.tool_format`).

Laid out like the chat template writes calls: no whitespace, object keys in case-insensitive
sorted order, bare keys (JSON-quoted when a key has characters a bare key cannot hold).
Enforced: ``type`` (one or several), ``properties`` with ``required``, ``additionalProperties``
(false, or a schema for the values of a map), ``items``, ``minItems`` >= 1, ``enum``, ``const``,
``anyOf`` / ``oneOf``. Other keywords (``pattern``, ``minimum``, ``$ref``, ...) are not
enforced by the grammar; arguments are validated against the whole schema after parsing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from atlas_core.parsing.coercion import schema_types
from atlas_core.parsing.tools.base import Literal
from atlas_core.parsing.tools.grammar import SCALAR_VALUES, parameters, quoted
from atlas_core.parsing.types import ToolDefinition

STRING_DELIMITER = '<|"|>'
_SCALARS = {**SCALAR_VALUES, "number": "/-?(0|[1-9][0-9]{0,99})(\\.[0-9]+)?([eE][+-]?[0-9]{1,2})?/"}
"""Scalar values; numbers with at most 100 integer digits and 2 exponent digits are always finite."""
_SAFE_KEY = re.compile(r"[A-Za-z_$][\w$.\-]*")


class _Rules:
    """Collects the rules of one grammar; every method returns a grammar item."""

    def __init__(self, lit: Literal) -> None:
        self.lit = lit
        self.rules: list[str] = []
        self._count = 0
        self._shared: set[str] = set()

    def rule(self, body: str) -> str:
        name = f"g4_{self._count}"
        self._count += 1
        self.rules.append(f"{name}: {body}")
        return name

    def shared(self, name: str, bodies: Sequence[str]) -> str:
        """Rules defined once per grammar (free strings, any value)."""
        if name not in self._shared:
            self._shared.add(name)
            self.rules.extend(bodies)
        return name

    def string(self) -> str:
        delimiter = self.lit(STRING_DELIMITER)
        escaped = re.escape(STRING_DELIMITER)
        if delimiter.startswith("<["):  # a special token ends the text, which must not spell it out
            bodies = [
                f"g4_string: {delimiter} G4_TEXT {delimiter}",
                f"G4_TEXT: /(?s:.*)/ & ~/(?s:.*){escaped}(?s:.*)/",
            ]
        else:  # the text runs to the first closing delimiter
            bodies = [f"g4_string: {delimiter} g4_text", f"g4_text[lazy]: /(?s:.*){escaped}/"]
        return self.shared("g4_string", bodies)

    def any_value(self) -> str:
        string = self.string()
        scalars = " | ".join(_SCALARS[t] for t in ("number", "boolean", "null"))
        return self.shared(
            "g4_any",
            [
                f"g4_any: {string} | g4_any_object | g4_any_array | {scalars}",
                'g4_any_object: "{" (g4_any_member ("," g4_any_member)*)? "}"',
                'g4_any_member: /[A-Za-z_][A-Za-z0-9_]*/ ":" g4_any',
                'g4_any_array: "[" (g4_any ("," g4_any)*)? "]"',
            ],
        )

    def constant(self, value: Any) -> str:
        """``value`` written in Gemma's syntax, as a sequence of items."""
        if isinstance(value, str):
            text = f" {quoted(value)} " if value else " "
            return f"{self.lit(STRING_DELIMITER)}{text}{self.lit(STRING_DELIMITER)}"
        if isinstance(value, dict):
            members = [f"{self.key(k)} {self.constant(v)}" for k, v in sorted(value.items(), key=_key_order)]
            return _enclosed("{", members, "}")
        if isinstance(value, list):
            return _enclosed("[", [self.constant(v) for v in value], "]")
        return quoted(json.dumps(value))

    def key(self, name: str) -> str:
        return quoted((name if _SAFE_KEY.fullmatch(name) else json.dumps(name, ensure_ascii=False)) + ":")

    def value(self, schema: Any) -> str:
        if not isinstance(schema, dict):
            return self.any_value()
        if "const" in schema:
            return self.constant(schema["const"])
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return "(" + " | ".join(self.constant(v) for v in schema["enum"]) + ")"
        for combinator in ("anyOf", "oneOf"):
            if isinstance(schema.get(combinator), list) and schema[combinator]:
                return "(" + " | ".join(self.value(s) for s in schema[combinator]) + ")"
        types = schema_types(schema)
        if not types:
            return self.any_value()
        alternatives = []
        for kind in sorted(types):
            if kind == "string":
                alternatives.append(self.string())
            elif kind == "object":
                alternatives.append(self.object(schema))
            elif kind == "array":
                alternatives.append(self.array(schema))
            elif kind in _SCALARS:
                alternatives.append(_SCALARS[kind])
        if not alternatives:
            return self.any_value()
        return alternatives[0] if len(alternatives) == 1 else "(" + " | ".join(alternatives) + ")"

    def array(self, schema: dict[str, Any]) -> str:
        item = self.value(schema.get("items", True))
        items = f'{item} ("," {item})*'
        minimum = schema.get("minItems")
        return self.rule(f'"[" {items} "]"' if isinstance(minimum, int) and minimum >= 1 else f'"[" ({items})? "]"')

    def object(self, schema: dict[str, Any]) -> str:
        properties = schema.get("properties")
        extra = schema.get("additionalProperties", True)
        if not isinstance(properties, dict) or not properties:
            if extra is False:
                return '"{}"'
            member = self.rule(f'/[A-Za-z_][A-Za-z0-9_]*/ ":" {self.value(extra)}')
            return self.rule(f'"{{" ({member} ("," {member})*)? "}}"')
        required = set(schema.get("required") or ())
        names = sorted(properties, key=str.lower)
        members = [self.rule(f"{self.key(n)} {self.value(properties[n])}") for n in names]
        needed = [n in required for n in names]
        first = self.members(members, needed, 0)
        return self.rule(f'"{{" {first} "}}"' if any(needed) else f'"{{" {first}? "}}"')

    def members(self, members: list[str], needed: list[bool], k: int) -> str:
        """A rule for members ``k:`` in order, comma-separated, none before the first written:
        member ``k`` and a comma before each later one, or (member ``k`` optional) members ``k+1:``.
        Never empty; the caller makes it optional when every member is."""
        later = zip(members[k + 1 :], needed[k + 1 :], strict=True)
        rest = " ".join(f'("," {m})' + ("" if need else "?") for m, need in later)
        written = f"{members[k]} {rest}".strip()
        if needed[k] or k + 1 == len(members):
            return self.rule(written)
        return self.rule(f"{written} | {self.members(members, needed, k + 1)}")


def _key_order(item: tuple[str, Any]) -> str:
    return item[0].lower()


def _enclosed(opening: str, items: list[str], closing: str) -> str:
    """``items`` comma-separated between ``opening`` and ``closing``, as a sequence of items."""
    separated = ' "," '.join(items)
    return f"{quoted(opening)} {separated} {quoted(closing)}" if items else quoted(opening + closing)


def gemma4_calls_grammar(
    tools: Sequence[ToolDefinition], lit: Literal, parallel: bool, call_start: str, call_end: str
) -> str:
    """Rules defining ``calls``: one ``call_start`` call:NAME{...} ``call_end`` of any of
    ``tools`` (one or more, back to back, with ``parallel``)."""
    rules = _Rules(lit)
    functions = [f"{quoted('call:' + tool.name)} {rules.object(parameters(tool))}" for tool in tools]
    repeat = "+" if parallel else ""
    return (
        "\n".join(
            [
                f"calls: call{repeat}",
                f"call: {lit(call_start)} ({' | '.join(functions)}) {lit(call_end)}",
                *rules.rules,
            ]
        )
        + "\n"
    )
