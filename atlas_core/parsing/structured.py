"""Constrained-decoding specifications: what a request asks for, both `SamplingParams` fields.

A `StructuredOutput` is an llguidance Lark grammar (JSON Schemas inline as ``%json {...}``),
checked when it is constructed; a `ThinkingBudget` bounds the reasoning block. The engine enforces
both while sampling (`atlas_core.engine.guided_decoding`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, get_args

import jsonschema
import llguidance
from jsonschema.validators import validator_for

from atlas_core.errors import InvalidRequestError

StructuredKind = Literal["json_object", "json_schema", "tool_call", "grammar"]
_KINDS: tuple[str, ...] = get_args(StructuredKind)


class StructuredOutputError(InvalidRequestError, ValueError):
    """A response format, schema or grammar that cannot be enforced; the message says why."""


def check_json_schema(schema: Any, what: str = "the JSON schema") -> dict[str, Any]:
    """``schema`` if it is a valid JSON Schema object, else `StructuredOutputError`."""
    if not isinstance(schema, dict):
        raise StructuredOutputError(f"{what} must be a JSON object, got {type(schema).__name__}")
    try:
        validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as e:
        path = "/".join(str(p) for p in e.absolute_path) or "the top level"
        raise StructuredOutputError(f"{what} is not a valid JSON Schema at {path}: {e.message}") from None
    return schema


JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""How generated JSON is laid out: one line, separated like Python's ``json.dumps`` (and the
``tojson`` of chat templates), so no tokens go to indentation."""


def json_schema_rule(schema: dict[str, Any], what: str = "the JSON schema", *, lenient: bool = False) -> str:
    """A Lark item generating JSON that matches ``schema`` (checked first). ``lenient``: keywords
    llguidance cannot enforce are ignored instead of being an error."""
    options = {**JSON_LAYOUT, "lenient": lenient, **check_json_schema(schema, what).get("x-guidance", {})}
    return "%json " + json.dumps({**schema, "x-guidance": options}, ensure_ascii=False)


@dataclass(frozen=True)
class StructuredOutput:
    """Output constrained to an llguidance Lark ``grammar``; ``kind`` says what it came from.
    Construction validates the grammar (`StructuredOutputError` with llguidance's message)."""

    kind: StructuredKind
    grammar: str

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise StructuredOutputError(f"structured output kind must be one of {', '.join(_KINDS)}, got {self.kind!r}")
        message = llguidance.LLMatcher.validate_grammar(self.llguidance_grammar)
        if message:
            raise StructuredOutputError(
                f"the {self.kind.replace('_', ' ')} constraint cannot be compiled: {message.strip()}"
            )

    @classmethod
    def json(cls, schema: dict[str, Any] | None = None) -> StructuredOutput:
        """Any JSON object (``schema`` None: ``json_object``), or JSON matching ``schema``."""
        if schema is None:
            return cls("json_object", f"start: {json_schema_rule({'type': 'object'})}")
        return cls("json_schema", f"start: {json_schema_rule(schema)}")

    @property
    def llguidance_grammar(self) -> str:
        """The grammar in llguidance's own (JSON) form, as `llguidance.LLMatcher` takes it."""
        return llguidance.LLMatcher.grammar_from_lark(self.grammar)


@dataclass(frozen=True)
class ThinkingBudget:
    """At most ``max_tokens`` reasoning tokens; then ``end_token_ids`` are forced (e.g. the ids of
    ``"\\n</think>\\n\\n"``). ``start_token_ids`` open the block (empty: generation starts inside
    it, the template opened it); ``close_token_ids`` are how the model closes it by itself (empty:
    the same as ``end_token_ids``)."""

    max_tokens: int
    end_token_ids: tuple[int, ...]
    start_token_ids: tuple[int, ...] = ()
    close_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise InvalidRequestError(f"the thinking budget must be >= 0 tokens, got {self.max_tokens}")
        if not self.end_token_ids:
            raise InvalidRequestError("a thinking budget needs the token ids that close the reasoning block")
        object.__setattr__(self, "end_token_ids", tuple(int(t) for t in self.end_token_ids))
        object.__setattr__(self, "start_token_ids", tuple(int(t) for t in self.start_token_ids))
        object.__setattr__(self, "close_token_ids", tuple(int(t) for t in self.close_token_ids or self.end_token_ids))

    @property
    def token_ids(self) -> tuple[int, ...]:
        """Every token id the budget names (for the vocabulary range check)."""
        return (*self.end_token_ids, *self.start_token_ids, *self.close_token_ids)
