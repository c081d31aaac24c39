"""What the server asks the engine for, built from a request's parser settings: grammars that
make the model emit its family's tool-call markup (``tool_choice`` required or named) or JSON
(``response_format``), optionally after a reasoning block, and thinking budgets.

Grammars refer to a marker by its special-token id when the tokenizer has it as one special
token (e.g. Mistral's ``[TOOL_CALLS]``), as text otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from atlas_core.parsing.errors import ToolSchemaError
from atlas_core.parsing.output_parser import ToolChoice, tool_choice_name
from atlas_core.parsing.registry import reasoning_format, tool_format
from atlas_core.parsing.structured import (
    StructuredKind,
    StructuredOutput,
    StructuredOutputError,
    ThinkingBudget,
    json_schema_rule,
)
from atlas_core.parsing.tools.base import Literal
from atlas_core.parsing.tools.grammar import quoted
from atlas_core.parsing.types import ToolDefinition
from atlas_core.tokenizer import Tokenizer


def special_tokens(tokenizer: Tokenizer | None) -> dict[str, int]:
    """Text -> id of the tokenizer's special added tokens."""
    if tokenizer is None:
        return {}
    return {t.content: i for i, t in tokenizer.backend.get_added_tokens_decoder().items() if t.special}


def needs_special_tokens(
    tokenizer: Tokenizer | None, reasoning_parser: str | None = None, tool_parser: str | None = None
) -> bool:
    """True when a marker of the chosen parsers is a special token of ``tokenizer``: the completion
    must then be detokenized with ``skip_special_tokens=False`` or the parsers never see it."""
    markers: list[str] = []
    if reasoning_parser:
        fmt = reasoning_format(reasoning_parser)
        markers += [fmt.start, fmt.end]
    if tool_parser:
        markers += tool_format(tool_parser).markers
    return bool(set(markers) & set(special_tokens(tokenizer)))


def _literal(tokenizer: Tokenizer | None) -> Literal:
    special = special_tokens(tokenizer)
    return lambda text: f"<[{special[text]}]>" if text in special else quoted(text)


def _start_rule(reasoning_parser: str | None, prompt_text: str, lit: Literal) -> list[str]:
    """``start``: an optional (or, when the prompt opened it, mandatory) reasoning block, then ``answer``."""
    if reasoning_parser is None:
        return ["start: answer"]
    fmt = reasoning_format(reasoning_parser)
    end = lit(fmt.end)
    if end.startswith("<["):
        rules = [f"think: /(?s:.*)/ {end}"]
    else:
        rules = [f"think[lazy]: /(?s:.*){re.escape(fmt.end).replace('/', chr(92) + '/')}/"]
    rules.append("THINK_GAP: /[ \\t\\r\\n]*/")
    if fmt.opened_by(prompt_text):
        return ["start: think THINK_GAP answer", *rules]
    if fmt.implicit_start:
        return [f"start: {lit(fmt.start)}? think THINK_GAP answer", *rules]
    return [f"start: ({lit(fmt.start)} think THINK_GAP)? answer", *rules]


def tool_call_constraint(
    tool_parser: str,
    tools: Sequence[ToolDefinition],
    tool_choice: ToolChoice,
    *,
    tokenizer: Tokenizer | None,
    reasoning_parser: str | None = None,
    prompt_text: str = "",
    parallel_tool_calls: bool = True,
) -> StructuredOutput | None:
    """The constraint that enforces ``tool_choice``: None for ``"auto"`` / ``"none"``; for
    ``"required"`` one or more calls (one unless ``parallel_tool_calls``) of any tool, for a named
    function calls of that tool, in ``tool_parser``'s markup with arguments matching each tool's
    schema, after a reasoning block when the model thinks first. `ToolSchemaError` when there are
    no tools or the named one is missing; `StructuredOutputError` for schemas that cannot be enforced."""
    name = tool_choice_name(tool_choice)
    if name is None and tool_choice in ("auto", "none"):
        return None
    fmt = tool_format(tool_parser)
    if not tools:
        raise ToolSchemaError("tool_choice requires a tool call, but the request has no tools")
    chosen = [t for t in tools if t.name == name] if name is not None else list(tools)
    if not chosen:
        raise ToolSchemaError(f"tool_choice names the function {name!r}, but no tool of that name was given")
    for tool in chosen:
        json_schema_rule(tool.parameters or {"type": "object"}, f"the parameters of tool {tool.name!r}")
    lit = _literal(tokenizer)
    lines = [
        *_start_rule(reasoning_parser, prompt_text, lit),
        "answer: calls",
        fmt.grammar(chosen, lit, parallel_tool_calls),
    ]
    return StructuredOutput("tool_call", "\n".join(lines))


def response_format_constraint(
    response_format: Mapping[str, Any] | None,
    *,
    tokenizer: Tokenizer | None = None,
    reasoning_parser: str | None = None,
    prompt_text: str = "",
) -> StructuredOutput | None:
    """The constraint for an OpenAI ``response_format``: None for absent or ``{"type": "text"}``;
    ``{"type": "json_object"}``: any JSON object; ``{"type": "json_schema", "json_schema":
    {"name", "schema", "strict"}}``: JSON matching ``schema`` (enforced whatever ``strict`` says).
    `StructuredOutputError` for anything else or an invalid schema."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind == "text":
        return None
    structured: StructuredKind
    if kind == "json_object":
        structured, answer = "json_object", json_schema_rule({"type": "object"})
    elif kind == "json_schema":
        structured = "json_schema"
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping) or "schema" not in spec:
            raise StructuredOutputError(
                "response_format json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}"
            )
        answer = json_schema_rule(spec["schema"], "response_format.json_schema.schema")
    else:
        raise StructuredOutputError(
            f"response_format type must be 'text', 'json_object' or 'json_schema', got {kind!r}"
        )
    lines = [*_start_rule(reasoning_parser, prompt_text, _literal(tokenizer)), f"answer: {answer}"]
    return StructuredOutput(structured, "\n".join(lines))


def thinking_budget(
    reasoning_parser: str, tokenizer: Tokenizer, prompt_text: str, budget_tokens: int
) -> ThinkingBudget:
    """A budget of ``budget_tokens`` reasoning tokens for ``reasoning_parser``'s markers: once spent,
    the engine forces ``"\\n" + end marker + "\\n\\n"``. Counting starts at once when the prompt
    opened the block (or the format starts inside it), else at the opening marker."""
    fmt = reasoning_format(reasoning_parser)

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tokenizer.encode(text, add_special_tokens=False))

    inside = fmt.opened_by(prompt_text) or fmt.implicit_start
    return ThinkingBudget(
        max_tokens=budget_tokens,
        end_token_ids=ids("\n" + fmt.end + "\n\n"),
        start_token_ids=() if inside else ids(fmt.start),
        close_token_ids=ids(fmt.end),
    )
