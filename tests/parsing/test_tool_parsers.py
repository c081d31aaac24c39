"""Every tool-call parser on scripted outputs: whole, streamed per character, and consistent."""

from __future__ import annotations

import json

import pytest

from atlas_core.parsing import OutputParser, tool_parser_names

from .cases import CASES, Case
from .support import TOOLS, check_streams_like_whole


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_parse(case: Case) -> None:
    message = OutputParser.parse(case.text, tool_parser=case.parser, tools=TOOLS)
    assert message.content == case.content
    assert [(c.name, json.loads(c.arguments)) for c in message.tool_calls] == case.calls
    assert len(message.problems) == len(case.problems), message.problems
    for problem, words in zip(message.problems, case.problems, strict=True):
        assert words in problem
    assert len({c.id for c in message.tool_calls}) == len(message.tool_calls)
    assert all(c.id.startswith("call_") for c in message.tool_calls)
    assert message.reasoning is None


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_streaming_per_character_matches_whole(case: Case) -> None:
    check_streams_like_whole(list(case.text), tool_parser=case.parser, tools=TOOLS)
    check_streams_like_whole([case.text], tool_parser=case.parser, tools=TOOLS)


def test_every_parser_has_cases() -> None:
    assert {c.parser for c in CASES} == set(tool_parser_names())


def test_arguments_are_canonical_json_of_the_coerced_values() -> None:
    message = OutputParser.parse(
        '<tool_call>{"name":"get_weather","arguments":{"city":"Rome","days":"3"}}</tool_call>',
        tool_parser="hermes",
        tools=TOOLS,
    )
    assert message.tool_calls[0].arguments == '{"city": "Rome", "days": 3}'
