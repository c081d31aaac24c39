"""The ``deepseek_v3`` tool-call format (V3 and V3.1 forms) on scripted outputs, whole and streamed per
character, the grammar checks every tool-call format passes, and the registration."""

from __future__ import annotations

import pytest

from atlas_core.testing.grammars import check_plugin_tool_format
from atlas_core.testing.parsers import PARIS, ROME3, UTC, ToolCallCase, check_tool_case

DS_BEGIN, DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"

CANONICAL = (
    f"{DS_BEGIN}{DS_CALL}function{DS_SEP}get_time\n```json\n" + '{"zone": "UTC"}\n```' + f"{DS_CALL_END}{DS_END}"
)
"""``get_time(zone="UTC")`` as the model writes it."""

CASES = [
    ToolCallCase(
        "deepseek_v3-parallel",
        "deepseek_v3",
        f"Let me check.{DS_BEGIN}{DS_CALL}function{DS_SEP}get_weather\n```json\n"
        + '{"city": "Rome", "days": 3}\n```'
        + f"{DS_CALL_END}{DS_CALL}function{DS_SEP}get_time\n```json\n"
        + '{"zone": "UTC"}\n```'
        + f"{DS_CALL_END}{DS_END}",
        "Let me check.",
        [ROME3, UTC],
    ),
    ToolCallCase(
        "deepseek_v3.1-form",
        "deepseek_v3",
        f'{DS_BEGIN}{DS_CALL}get_weather{DS_SEP}{{"city": "Paris"}}{DS_CALL_END}{DS_END}',
        "",
        [PARIS],
    ),
    ToolCallCase(
        "deepseek_v3-malformed",
        "deepseek_v3",
        f"{DS_BEGIN}{DS_CALL}get_weather{{}}{DS_CALL_END}{DS_END}",
        f"{DS_BEGIN}{DS_CALL}get_weather{{}}{DS_CALL_END}{DS_END}",
        [],
        ("lacks",),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_tool_call_cases(case: ToolCallCase) -> None:
    check_tool_case(case)


def test_grammar_checks_and_registration() -> None:
    check_plugin_tool_format("deepseek_v3", "atlas-model-deepseek", CANONICAL)
