"""A chat request's generation constraints as `SamplingParams` fields.

- ``tool_choice`` ``required`` or named: a grammar that makes the model write its family's
  tool-call markup (arguments matching the tool's schema), after its reasoning block if any.
- ``response_format`` ``json_object`` / ``json_schema``: a grammar for JSON (matching the schema).
- A thinking budget (Anthropic ``thinking.budget_tokens``, OpenAI ``reasoning_effort``) caps the
  reasoning tokens, then closes the block; it needs a reasoning parser, without one the model's
  reasoning format is unknown and the budget is not applied.
- When a parser's markers are special tokens of the tokenizer, the text keeps special tokens
  (``skip_special_tokens`` false) so the parsers can see them.
"""

from __future__ import annotations

from typing import Any

import msgspec

from atlas_core.parsing import needs_special_tokens, response_format_constraint, thinking_budget, tool_call_constraint
from atlas_core.server.errors import invalid
from atlas_core.server.output_parsing import ParserSpec
from atlas_core.server.schemas_openai import ResponseFormat, TextFormat
from atlas_core.tokenizer import Tokenizer

REASONING_EFFORT_BUDGET = {"low": 1024, "medium": 4096}
"""OpenAI ``reasoning_effort`` -> thinking budget in tokens (``high``: no cap; ``none`` and
``minimal`` turn thinking off through the template instead)."""


def constraint_fields(
    parsers: ParserSpec,
    tokenizer: Tokenizer,
    *,
    response_format: ResponseFormat | None = None,
    thinking_tokens: int | None = None,
) -> dict[str, Any]:
    """``structured``, ``thinking_budget`` and ``skip_special_tokens`` for `SamplingParams`."""
    setup, reasoning = parsers.setup, parsers.reasoning_parser
    fields: dict[str, Any] = {}
    wants_json = response_format is not None and not isinstance(response_format, TextFormat)
    tool_forced = parsers.tool_parser is not None and setup.tool_choice not in ("auto", "none")
    if wants_json and tool_forced:
        raise invalid(
            "response_format cannot be combined with a required or named tool_choice", param="response_format"
        )
    if tool_forced:
        assert parsers.tool_parser is not None
        fields["structured"] = tool_call_constraint(
            parsers.tool_parser,
            setup.tools,
            setup.tool_choice,
            tokenizer=tokenizer,
            reasoning_parser=reasoning,
            prompt_text=parsers.prompt_text,
            parallel_tool_calls=setup.parallel_tool_calls,
        )
    elif wants_json:
        fields["structured"] = response_format_constraint(
            msgspec.to_builtins(response_format),
            tokenizer=tokenizer,
            reasoning_parser=reasoning,
            prompt_text=parsers.prompt_text,
        )
    if thinking_tokens is not None and reasoning is not None:
        fields["thinking_budget"] = thinking_budget(reasoning, tokenizer, parsers.prompt_text, thinking_tokens)
    if needs_special_tokens(tokenizer, reasoning, parsers.tool_parser):
        fields["skip_special_tokens"] = False
    return fields
