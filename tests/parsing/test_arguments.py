"""Argument coercion and validation, tool-name resolution and tool_choice handling in the parser."""

from __future__ import annotations

import pytest

from atlas_core.parsing import OutputParser, ToolDefinition, ToolSchemaError
from atlas_core.parsing.coercion import coerce
from atlas_core.testing.parsers import TOOLS

SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer"},
        "x": {"type": "number"},
        "flag": {"type": "boolean"},
        "maybe": {"type": ["integer", "null"]},
        "tags": {"type": "array", "items": {"type": "integer"}},
        "nested": {"type": "object", "properties": {"depth": {"type": "integer"}}},
        "label": {"type": "string"},
        "either": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
    },
}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"n": "3"}, {"n": 3}),
        ({"n": " -12 "}, {"n": -12}),
        ({"n": "3.5"}, {"n": "3.5"}),  # not an integer: left for validation to reject
        ({"x": "2.5"}, {"x": 2.5}),
        ({"x": "7"}, {"x": 7}),
        ({"x": "nan"}, {"x": "nan"}),
        ({"flag": "True"}, {"flag": True}),
        ({"flag": "false"}, {"flag": False}),
        ({"flag": "yes"}, {"flag": "yes"}),
        ({"maybe": "null"}, {"maybe": None}),
        ({"maybe": "4"}, {"maybe": 4}),
        ({"tags": "[1, 2]"}, {"tags": [1, 2]}),
        ({"tags": ["1", 2]}, {"tags": [1, 2]}),
        ({"nested": '{"depth": "2"}'}, {"nested": {"depth": 2}}),
        ({"nested": '["not", "an", "object"]'}, {"nested": '["not", "an", "object"]'}),
        ({"label": "3"}, {"label": "3"}),  # strings stay strings
        ({"either": "3"}, {"either": "3"}),  # ambiguous: untouched
        ({"unknown": "3"}, {"unknown": "3"}),
    ],
)
def test_coercion_only_where_unambiguous(value: dict, expected: dict) -> None:
    assert coerce(value, SCHEMA) == expected


def test_name_matching_is_case_space_and_underscore_insensitive_but_unique() -> None:
    tools = [ToolDefinition("get_time"), ToolDefinition("GetTime")]
    text = '<tool_call>{"name": "Get-Time ", "arguments": {"zone": "UTC"}}</tool_call>'
    ambiguous = OutputParser.parse(text, tool_parser="hermes", tools=tools)
    assert ambiguous.tool_calls == [] and "could be any of the tools GetTime, get_time" in ambiguous.problems[0]
    unique = OutputParser.parse(text, tool_parser="hermes", tools=TOOLS)
    assert unique.tool_calls[0].name == "get_time"


def test_invalid_tool_schema_is_a_request_error() -> None:
    bad = ToolDefinition("f", parameters={"type": "object", "properties": {"a": {"type": "integr"}}})
    with pytest.raises(ToolSchemaError, match="'f': parameters is not a valid JSON Schema"):
        OutputParser(tool_parser="hermes", tools=[bad])


CALL = '<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>'


def test_tool_choice_none_and_no_tools_leave_markup_as_content() -> None:
    for args in ({"tools": TOOLS, "tool_choice": "none"}, {"tools": []}):
        message = OutputParser.parse(CALL, tool_parser="hermes", **args)
        assert (message.content, message.tool_calls, message.problems) == (CALL, [], [])
    assert not OutputParser(tool_parser="hermes", tools=TOOLS, tool_choice="none").parses_tool_calls


def test_tool_choice_required_without_a_call_is_a_problem() -> None:
    message = OutputParser.parse("I won't.", tool_parser="hermes", tools=TOOLS, tool_choice="required")
    assert message.content == "I won't."
    assert message.problems == ["tool_choice requires a tool call, but the model made none"]


def test_named_tool_choice_allows_only_that_tool() -> None:
    for choice in ({"name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}):
        message = OutputParser.parse(CALL, tool_parser="hermes", tools=TOOLS, tool_choice=choice)
        assert message.tool_calls == []
        assert message.content == CALL
        assert "tool_choice does not allow calling 'get_time'" in message.problems[0]
    with pytest.raises(ToolSchemaError, match="no tool of that name"):
        OutputParser(tool_parser="hermes", tools=TOOLS, tool_choice={"name": "fly"})
    with pytest.raises(ToolSchemaError, match="tool_choice must be"):
        OutputParser(tool_parser="hermes", tools=TOOLS, tool_choice="sometimes")


def test_feed_after_finish_is_an_error() -> None:
    parser = OutputParser(tool_parser="hermes", tools=TOOLS)
    parser.finish()
    with pytest.raises(RuntimeError):
        parser.feed("x")
