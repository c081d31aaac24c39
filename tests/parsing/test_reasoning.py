"""Core's reasoning parsers: the think block split from content, streamed or whole, prompt-opened or
not; unknown parser names."""

from __future__ import annotations

import pytest

from atlas_core.builtin_plugin import CORE_REASONING_PARSERS, CORE_TOOL_PARSERS
from atlas_core.parsing import (
    OutputParser,
    ReasoningDelta,
    UnknownParserError,
    reasoning_parser_names,
    tool_parser_names,
)
from atlas_core.testing.parsers import TOOLS, check_reasoning_case, check_streams_like_whole, without_ids

QWEN_PROMPT_OPEN = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
QWEN_PROMPT_CLOSED = "<|im_start|>assistant\n<think>\n\n</think>\n\n"

CASES = [
    # (id, parser, prompt, output, reasoning, content)
    (
        "qwen3-block",
        "qwen3",
        "",
        "<think>\nLet me think.\nOK.\n</think>\n\nThe answer is 4.",
        "Let me think.\nOK.",
        "The answer is 4.",
    ),
    ("qwen3-no-block", "qwen3", "", "The answer is 4.", None, "The answer is 4."),
    ("qwen3-prompt-opened", "qwen3", QWEN_PROMPT_OPEN, "Two plus two.\n</think>\n\n4", "Two plus two.", "4"),
    (
        "qwen3-prompt-closed",
        "qwen3",
        QWEN_PROMPT_CLOSED,
        "4, and <think> is text here",
        None,
        "4, and <think> is text here",
    ),
    (
        "qwen3-unterminated",
        "qwen3",
        "",
        "<think>\nStill thinking when the budget ran out",
        "Still thinking when the budget ran out",
        "",
    ),
    ("qwen3-empty-block", "qwen3", "", "<think>\n\n</think>\n\nHello", "", "Hello"),
    ("qwen3-leading-space-content", "qwen3", "", "  Hello <think>", None, "  Hello <think>"),
    ("deepseek_r1-no-open-tag", "deepseek_r1", "", "Hmm, 2+2.\n</think>\n\n4", "Hmm, 2+2.", "4"),
    ("deepseek_r1-open-tag", "deepseek_r1", "", "<think>Hmm.</think>4", "Hmm.", "4"),
    ("deepseek_r1-never-closed", "deepseek_r1", "", "Hmm, all reasoning", "Hmm, all reasoning", ""),
    ("mistral-block", "mistral", "", "[THINK]Plan: add.[/THINK]4", "Plan: add.", "4"),
    ("mistral-prompt-opened", "mistral", "[INST]Hi[/INST][THINK]", "Plan.[/THINK] 4", "Plan.", "4"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_reasoning_split(case: tuple[str, str, str, str, str | None, str]) -> None:
    check_reasoning_case(*case[1:])


def test_reasoning_streams_before_the_block_closes() -> None:
    parser = OutputParser(reasoning_parser="qwen3")
    assert parser.feed("<thi") == []
    assert parser.feed("nk>\nStep one") == [ReasoningDelta("Step one")]
    assert parser.feed(". </thi") == [ReasoningDelta(".")]  # the space and the partial marker are held
    assert parser.feed("nk>\n\n") == []


def test_reasoning_then_tool_call_and_calls_inside_reasoning_are_ignored() -> None:
    text = (
        '<think>\nMaybe <tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>?\n</think>\n\n'
        'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    args = {"reasoning_parser": "qwen3", "tool_parser": "hermes", "tools": TOOLS}
    message = OutputParser.parse(text, **args)
    assert message.reasoning.startswith("Maybe <tool_call>")
    assert message.content == "Checking."
    assert [c.name for c in message.tool_calls] == ["get_weather"]
    streamed = check_streams_like_whole(list(text), **args)
    assert without_ids(streamed) == without_ids(message)


def test_every_core_parser_has_cases() -> None:
    assert {c[1] for c in CASES} == set(CORE_REASONING_PARSERS)


def test_unknown_parser_names_list_the_registered_ones() -> None:
    with pytest.raises(UnknownParserError, match="unknown reasoning parser 'o1'; valid names: deepseek_r1, ") as info:
        OutputParser(reasoning_parser="o1")
    assert set(CORE_REASONING_PARSERS) <= set(reasoning_parser_names())
    assert all(name in str(info.value) for name in reasoning_parser_names())
    with pytest.raises(UnknownParserError, match="unknown tool-call parser 'llama3_json'") as info:
        OutputParser(tool_parser="llama3_json", tools=TOOLS)
    assert set(CORE_TOOL_PARSERS) <= set(tool_parser_names())
    assert all(name in str(info.value) for name in tool_parser_names())
    assert isinstance(info.value, ValueError)
