"""Gemma 4's parsers on scripted outputs (tool calls, and reasoning in the ``thought`` channel), whole
and streamed per character; the grammar checks every tool-call format passes; and the plugin's
registrations (the argument syntax and Gemma-specific grammar are `test_gemma4_parsers.py`'s)."""

from __future__ import annotations

import pytest

from atlas_core.plugins import get_registry
from atlas_core.testing.grammars import check_plugin_tool_format
from atlas_core.testing.parsers import PARIS, ROME3, UTC, ToolCallCase, check_reasoning_case, check_tool_case

Q = '<|"|>'  # Gemma 4's string delimiter
G4, G4_END = "<|tool_call>call:", "<tool_call|>"
GEMMA_PROMPT = "<|turn>system\n<|think|>\n<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"

TOOL_CASES = [
    ToolCallCase("gemma4-single", "gemma4", f"{G4}get_weather{{city:{Q}Paris{Q}}}{G4_END}", "", [PARIS]),
    ToolCallCase(
        "gemma4-parallel-after-text",
        "gemma4",
        f"I'll check both.\n{G4}get_weather{{city:{Q}Rome{Q},days:3}}{G4_END}{G4}get_time{{zone:{Q}UTC{Q}}}{G4_END}",
        "I'll check both.",
        [ROME3, UTC],
    ),
    ToolCallCase(
        "gemma4-strings-hold-markup-characters",
        "gemma4",
        f'{G4}get_weather{{city:{Q}Paris, "TX" {{a:1}} [b], c:d\\n{Q}}}{G4_END} then text',
        "then text",
        [("get_weather", {"city": 'Paris, "TX" {a:1} [b], c:d\\n'})],
    ),
    ToolCallCase(
        "gemma4-nested-values",
        "gemma4",
        f"{G4}get_weather{{city:{Q}Oslo{Q},days:-2,metric:false,options:{{hourly:true}},"
        f"tags:[{Q}a,b{Q},1.5e3,null,{{k:[]}},[0.25,true]]}}{G4_END}",
        "",
        [
            (
                "get_weather",
                {
                    "city": "Oslo",
                    "days": -2,
                    "metric": False,
                    "options": {"hourly": True},
                    "tags": ["a,b", 1500.0, None, {"k": []}, [0.25, True]],
                },
            )
        ],
    ),
    ToolCallCase(
        "gemma4-fuzzy-name-and-coercion",
        "gemma4",
        f"{G4}Get-Weather{{city:{Q}Rome{Q},days:{Q}3{Q},metric:{Q}true{Q},"
        f'options:{Q}{{"hourly": "false"}}{Q}}}{G4_END}',
        "",
        [("get_weather", {"city": "Rome", "days": 3, "metric": True, "options": {"hourly": False}})],
    ),
    ToolCallCase(
        "gemma4-bare-string",
        "gemma4",
        f"Hi {G4}get_weather{{city:Paris}}{G4_END}",
        f"Hi {G4}get_weather{{city:Paris}}{G4_END}",
        [],
        ("'Paris' is not a number",),
    ),
    ToolCallCase(
        "gemma4-unclosed-string",
        "gemma4",
        f"{G4}get_time{{zone:{Q}UTC}}{G4_END}",
        f"{G4}get_time{{zone:{Q}UTC}}{G4_END}",
        [],
        ("never closed",),
    ),
    ToolCallCase(
        "gemma4-no-call-prefix",
        "gemma4",
        f"<|tool_call>get_time{{zone:{Q}UTC{Q}}}{G4_END}",
        f"<|tool_call>get_time{{zone:{Q}UTC{Q}}}{G4_END}",
        [],
        ("must hold call:NAME",),
    ),
    ToolCallCase(
        "gemma4-text-after-arguments",
        "gemma4",
        f"{G4}get_time{{zone:{Q}UTC{Q}}} and more{G4_END}",
        f"{G4}get_time{{zone:{Q}UTC{Q}}} and more{G4_END}",
        [],
        ("text after the arguments of 'get_time'",),
    ),
    ToolCallCase(
        "gemma4-schema-mismatch",
        "gemma4",
        f"{G4}get_weather{{city:{Q}Rome{Q},days:{Q}many{Q}}}{G4_END}",
        f"{G4}get_weather{{city:{Q}Rome{Q},days:{Q}many{Q}}}{G4_END}",
        [],
        ("do not match its schema",),
    ),
    ToolCallCase(
        "gemma4-unknown-and-known",
        "gemma4",
        f"{G4}launch{{}}{G4_END}\n{G4}get_time{{zone:{Q}UTC{Q}}}{G4_END}",
        f"{G4}launch{{}}{G4_END}",
        [UTC],
        ("unknown tool 'launch'",),
    ),
    ToolCallCase(
        "gemma4-unclosed-but-complete",
        "gemma4",
        f"Sure.\n{G4}get_time{{zone:{Q}UTC{Q}}}",
        "Sure.",
        [UTC],
    ),
    ToolCallCase(
        "gemma4-truncated",
        "gemma4",
        f"Sure.\n{G4}get_time{{zone:{Q}UT",
        f"Sure.\n{G4}get_time{{zone:{Q}UT",
        [],
        ("output ended before <tool_call|>",),
    ),
    ToolCallCase(
        "gemma4-plain-text", "gemma4", "a <|tool, <tool_call|> are text", "a <|tool, <tool_call|> are text", []
    ),
]

REASONING_CASES = [
    # (id, parser, prompt, output, reasoning, content)
    (
        "gemma4-block",
        "gemma4",
        GEMMA_PROMPT,
        "<|channel>thought\nThe user greets me.\n<channel|>Hello! <|channel> stays text.",
        "The user greets me.",
        "Hello! <|channel> stays text.",
    ),
    ("gemma4-no-block", "gemma4", GEMMA_PROMPT, "Hello, thought-free.", None, "Hello, thought-free."),
    ("gemma4-other-channel", "gemma4", GEMMA_PROMPT, "<|channel>final<channel|>", None, "<|channel>final<channel|>"),
    ("gemma4-empty-block", "gemma4", GEMMA_PROMPT, "<|channel>thought\n<channel|>Hi", "", "Hi"),
    ("gemma4-prompt-closed", "gemma4", GEMMA_PROMPT + "<|channel>thought\n<channel|>", "Hi", None, "Hi"),
    ("gemma4-prompt-opened", "gemma4", GEMMA_PROMPT + "<|channel>thought\n", "Plan.<channel|>Hi", "Plan.", "Hi"),
    ("gemma4-unterminated", "gemma4", GEMMA_PROMPT, "<|channel>thought\nStill going", "Still going", ""),
]


@pytest.mark.parametrize("case", TOOL_CASES, ids=[c.id for c in TOOL_CASES])
def test_tool_call_cases(case: ToolCallCase) -> None:
    check_tool_case(case)


@pytest.mark.parametrize("case", REASONING_CASES, ids=[c[0] for c in REASONING_CASES])
def test_reasoning_cases(case: tuple[str, str, str, str, str | None, str]) -> None:
    check_reasoning_case(*case[1:])


def test_tool_format_grammar_checks_and_registration() -> None:
    check_plugin_tool_format("gemma4", "atlas-model-gemma", f"{G4}get_time{{zone:{Q}UTC{Q}}}{G4_END}")


def test_the_plugin_registers_the_reasoning_format() -> None:
    assert get_registry().get("reasoning_parser", "gemma4").plugin.distribution == "atlas-model-gemma"
