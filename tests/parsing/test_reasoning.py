"""Reasoning parsers: the think block split from content, streamed or whole, prompt-opened or not."""

from __future__ import annotations

import pytest

from atlas_core.parsing import (
    OutputParser,
    ReasoningDelta,
    UnknownParserError,
    reasoning_parser_names,
    tool_parser_names,
)

from .support import TOOLS, check_streams_like_whole, without_ids

QWEN_PROMPT_OPEN = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
QWEN_PROMPT_CLOSED = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
GEMMA_PROMPT = "<|turn>system\n<|think|>\n<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"

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


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_reasoning_split(case: tuple) -> None:
    _, parser, prompt, output, reasoning, content = case
    message = OutputParser.parse(output, reasoning_parser=parser, prompt_text=prompt)
    assert (message.reasoning, message.content) == (reasoning, content)
    streamed = check_streams_like_whole(list(output), reasoning_parser=parser, prompt_text=prompt)
    assert without_ids(streamed) == without_ids(message)


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


def test_unknown_parser_names_list_the_valid_ones() -> None:
    with pytest.raises(UnknownParserError, match="valid names: deepseek_r1, gemma4, mistral, qwen3"):
        OutputParser(reasoning_parser="o1")
    with pytest.raises(UnknownParserError) as info:
        OutputParser(tool_parser="llama3_json", tools=TOOLS)
    assert all(name in str(info.value) for name in tool_parser_names())
    assert isinstance(info.value, ValueError)
    assert reasoning_parser_names() == ["deepseek_r1", "gemma4", "mistral", "qwen3"]
