"""Grammars for tool_choice and response_format: every text they allow parses back (random walks
through the grammar on a byte-level tokenizer), canonical markup is allowed, bad input is refused.
Core's tool-call formats are checked here; a family plugin's formats in that plugin's tests."""

from __future__ import annotations

import pytest

from atlas_core.builtin_plugin import CORE_TOOL_PARSERS
from atlas_core.errors import InvalidRequestError
from atlas_core.parsing import (
    StructuredOutput,
    StructuredOutputError,
    ToolDefinition,
    ToolSchemaError,
    needs_special_tokens,
    response_format_constraint,
    thinking_budget,
    tool_call_constraint,
)
from atlas_core.testing.grammars import TOKENIZER, accepts, check_canonical_markup, check_grammar_outputs_parse
from atlas_core.testing.parsers import TOOLS

CORE_PARSERS = sorted(CORE_TOOL_PARSERS)


@pytest.mark.parametrize("parser", CORE_PARSERS)
@pytest.mark.parametrize("choice", ["required", {"name": "reset"}])
def test_every_output_the_grammar_allows_parses_to_valid_calls(parser: str, choice) -> None:
    check_grammar_outputs_parse(parser, choice)


CANONICAL = {
    "hermes": '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>',
    "nemotron": '<TOOLCALL>[{"name": "get_time", "arguments": {"zone": "UTC"}}]</TOOLCALL>',
    "mistral": '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "UTC"}}]',
    "json": '[{"name": "get_time", "arguments": {"zone": "UTC"}}]',
    "qwen3_coder": "<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>",
}


@pytest.mark.parametrize("parser", CORE_PARSERS)
def test_canonical_markup_is_allowed_and_parsed(parser: str) -> None:
    check_canonical_markup(parser, CANONICAL[parser])


CALL = CANONICAL["hermes"]


@pytest.mark.parametrize(
    ("reasoning", "prompt", "good", "bad"),
    [
        (None, "", [CALL], ["<think>x</think>" + CALL, "Sure. " + CALL]),
        ("qwen3", "", [CALL, "<think>\nweather?\n</think>\n\n" + CALL], ["weather?</think>" + CALL]),
        ("qwen3", "<|im_start|>assistant\n<think>\n", ["weather?\n</think>\n\n" + CALL, "</think>" + CALL], [CALL]),
        ("deepseek_r1", "", ["hmm</think>" + CALL, "<think>hmm</think>\n" + CALL], [CALL]),
        ("mistral", "", ["[THINK]hmm[/THINK]" + CALL, CALL], ["hmm[/THINK]" + CALL]),
    ],
)
def test_reasoning_before_the_constrained_answer(reasoning, prompt, good, bad) -> None:
    structured = tool_call_constraint(
        "hermes", TOOLS, "required", tokenizer=TOKENIZER, reasoning_parser=reasoning, prompt_text=prompt
    )
    assert all(accepts(structured, text) for text in good)
    assert not any(accepts(structured, text) for text in bad)


def test_response_formats() -> None:
    assert response_format_constraint(None) is None
    assert response_format_constraint({"type": "text"}) is None
    any_object = response_format_constraint({"type": "json_object"}, tokenizer=TOKENIZER)
    assert any_object.kind == "json_object"
    assert accepts(any_object, '{"a": [1, 2]}') and not accepts(any_object, "[1]")
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    typed = response_format_constraint(
        {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    )
    assert typed.kind == "json_schema"
    assert accepts(typed, '{"n": 3}') and not accepts(typed, '{"n": "3"}') and not accepts(typed, '{"n":3}')
    assert accepts(StructuredOutput.json(schema), '{"n": 3}')
    thinking = response_format_constraint({"type": "json_object"}, reasoning_parser="qwen3")
    assert accepts(thinking, "<think>\nhm\n</think>\n\n{}")


@pytest.mark.parametrize(
    ("response_format", "message"),
    [
        ({"type": "xml"}, "must be 'text', 'json_object' or 'json_schema'"),
        ({"type": "json_schema"}, "needs {'json_schema'"),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}},
            "not a valid JSON Schema",
        ),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": []}}, "must be a JSON object"),
    ],
)
def test_bad_response_formats_are_request_errors(response_format, message) -> None:
    with pytest.raises(StructuredOutputError, match=message) as info:
        response_format_constraint(response_format)
    assert isinstance(info.value, ValueError) and isinstance(info.value, InvalidRequestError)


def test_bad_grammars_and_tool_choices() -> None:
    with pytest.raises(StructuredOutputError, match="cannot be compiled"):
        StructuredOutput("grammar", "start: undefined_rule")
    with pytest.raises(StructuredOutputError, match="kind must be"):
        StructuredOutput("yaml", "start: %json {}")
    assert tool_call_constraint("hermes", TOOLS, "auto", tokenizer=None) is None
    assert tool_call_constraint("hermes", TOOLS, "none", tokenizer=None) is None
    with pytest.raises(ToolSchemaError, match="has no tools"):
        tool_call_constraint("hermes", [], "required", tokenizer=None)
    with pytest.raises(ToolSchemaError, match="no tool of that name"):
        tool_call_constraint("hermes", TOOLS, {"name": "fly"}, tokenizer=None)
    bad = ToolDefinition("f", parameters={"type": "object", "properties": {"a": {"type": 5}}})
    with pytest.raises(StructuredOutputError, match="parameters of tool 'f'"):
        tool_call_constraint("hermes", [bad], "required", tokenizer=None)


def test_special_token_markers_and_thinking_budgets() -> None:
    assert needs_special_tokens(TOKENIZER, tool_parser="mistral")
    assert needs_special_tokens(TOKENIZER, reasoning_parser="mistral")
    assert not needs_special_tokens(TOKENIZER, reasoning_parser="qwen3", tool_parser="hermes")
    assert not needs_special_tokens(None, tool_parser="mistral")
    grammar = tool_call_constraint("mistral", TOOLS, "required", tokenizer=TOKENIZER).grammar
    assert f"<[{TOKENIZER.backend.token_to_id('[TOOL_CALLS]')}]>" in grammar

    encode = lambda text: tuple(TOKENIZER.encode(text, add_special_tokens=False))  # noqa: E731
    budget = thinking_budget("qwen3", TOKENIZER, "<|im_start|>assistant\n", 100)
    assert (budget.max_tokens, budget.start_token_ids) == (100, encode("<think>"))
    assert (budget.end_token_ids, budget.close_token_ids) == (encode("\n</think>\n\n"), encode("</think>"))
    assert thinking_budget("qwen3", TOKENIZER, "<|im_start|>assistant\n<think>\n", 5).start_token_ids == ()
    assert thinking_budget("deepseek_r1", TOKENIZER, "", 5).start_token_ids == ()
    assert (
        thinking_budget("mistral", TOKENIZER, "", 5).close_token_ids
        == encode("[/THINK]")
        == (TOKENIZER.backend.token_to_id("[/THINK]"),)
    )
