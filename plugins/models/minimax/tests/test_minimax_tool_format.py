"""The ``minimax_m2`` tool-call format on scripted outputs, whole and streamed per character, the
grammar checks every tool-call format passes, and the registration."""

from __future__ import annotations

import pytest

from atlas_core.testing.grammars import check_plugin_tool_format
from atlas_core.testing.parsers import ROME3, UTC, ToolCallCase, check_tool_case

CANONICAL = (
    '<minimax:tool_call>\n<invoke name="get_time">\n<parameter name="zone">UTC</parameter>\n</invoke>\n'
    "</minimax:tool_call>"
)
"""``get_time(zone="UTC")`` as the model writes it."""

CASES = [
    ToolCallCase(
        "minimax_m2-parallel",
        "minimax_m2",
        'Okay.\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Rome</parameter>\n'
        '<parameter name="days">3</parameter>\n</invoke>\n<invoke name="get_time">\n'
        '<parameter name="zone">UTC</parameter>\n'
        "</invoke>\n</minimax:tool_call>",
        "Okay.",
        [ROME3, UTC],
    ),
    ToolCallCase(
        "minimax_m2-unknown",
        "minimax_m2",
        '<minimax:tool_call>\n<invoke name="x">\n</invoke>\n</minimax:tool_call>',
        '<minimax:tool_call>\n<invoke name="x">\n</invoke>\n</minimax:tool_call>',
        [],
        ("unknown tool 'x'",),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_tool_call_cases(case: ToolCallCase) -> None:
    check_tool_case(case)


def test_grammar_checks_and_registration() -> None:
    check_plugin_tool_format("minimax_m2", "atlas-model-minimax", CANONICAL)
