"""Core's tool-call parsers on scripted outputs: whole, streamed per character, and consistent."""

from __future__ import annotations

import pytest

from atlas_core.builtin_plugin import CORE_TOOL_PARSERS
from atlas_core.parsing import OutputParser
from atlas_core.testing.parsers import TOOLS, ToolCallCase, check_tool_case

from .cases import CASES


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_parse_whole_and_streamed(case: ToolCallCase) -> None:
    check_tool_case(case)


def test_every_core_parser_has_cases() -> None:
    assert {c.parser for c in CASES} == set(CORE_TOOL_PARSERS)


def test_arguments_are_canonical_json_of_the_coerced_values() -> None:
    message = OutputParser.parse(
        '<tool_call>{"name":"get_weather","arguments":{"city":"Rome","days":"3"}}</tool_call>',
        tool_parser="hermes",
        tools=TOOLS,
    )
    assert message.tool_calls[0].arguments == '{"city": "Rome", "days": 3}'
