"""Property: however the output is split into deltas, the streamed events add up to the same
thing as parsing it whole."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from atlas_core.testing.parsers import TOOLS, check_streams_like_whole, split

from .cases import CASES

THINKING = "<think>\nThe user wants weather. </think>\n\n"
MARKUP = ["<think>", "</think>", "<tool_call>", "</tool_call>", '{"name": "get_time", "arguments": {"zone": "UTC"}}']


@settings(max_examples=300, deadline=None)
@given(
    case=st.sampled_from(CASES),
    think=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=40),
)
def test_any_split_streams_like_the_whole(case, think: bool, cuts: list[int]) -> None:
    text = (THINKING if think else "") + case.text
    args = {"tool_parser": case.parser, "tools": TOOLS, "reasoning_parser": "qwen3" if think else None}
    check_streams_like_whole(split(text, cuts), **args)


@settings(max_examples=200, deadline=None)
@given(
    text=st.lists(st.sampled_from([*'ab \n<>/{}[]:"', *MARKUP]), max_size=40).map("".join),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=20),
)
def test_arbitrary_markup_soup_never_crashes_and_streams_like_the_whole(text: str, cuts: list[int]) -> None:
    args = {"tool_parser": "hermes", "tools": TOOLS, "reasoning_parser": "qwen3"}
    message = check_streams_like_whole(split(text, cuts), **args)
    if not message.problems:  # every call region was honoured: none of its markup is content
        assert "<tool_call>" not in message.content
