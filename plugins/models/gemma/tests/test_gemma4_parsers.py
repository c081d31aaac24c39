"""Gemma 4's parsers: the argument syntax, whole turns (reasoning, text, calls) streamed at every
split, and the grammar for tool_choice with Gemma's markers as special tokens or as plain text.

Scripted tool-call and reasoning cases, and the checks every tool-call format passes, are in
`test_gemma4_cases.py`."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from atlas_model_gemma.tool_format import read_gemma4_arguments
from hypothesis import given, settings
from hypothesis import strategies as st

from atlas_core.parsing import (
    OutputParser,
    ToolDefinition,
    needs_special_tokens,
    thinking_budget,
    tool_call_constraint,
)
from atlas_core.parsing.tools import MarkupError
from atlas_core.testing.grammars import SPECIAL, accepts, byte_tokenizer, random_walk
from atlas_core.testing.parsers import TOOLS, check_streams_like_whole, split

Q = '<|"|>'
GEMMA_TOKENIZER = byte_tokenizer([*SPECIAL, Q, "<|tool_call>", "<tool_call|>", "<|channel>", "<channel|>"])
TEXT_TOKENIZER = byte_tokenizer()
TOKENIZERS = pytest.mark.parametrize("tokenizer", [GEMMA_TOKENIZER, TEXT_TOKENIZER], ids=["special", "text"])


# --- the argument syntax ---------------------------------------------------------------------

READ = [
    ("{}", {}),
    ("{a:1,b:-2.5,c:1e3,d:true,e:false,f:null}", {"a": 1, "b": -2.5, "c": 1000.0, "d": True, "e": False, "f": None}),
    (f"{{ s : {Q}x, y: {{z}}{Q} , t:[ 1 , [ ] , {{ }} ] }}", {"s": "x, y: {z}", "t": [1, [], {}]}),
    (f'{{{Q}odd key: x{Q}:1,"json key":"json \\"value\\"\\n"}}', {"odd key: x": 1, "json key": 'json "value"\n'}),
    (f"{{s:{Q}{Q},u:{Q}Zürich 東京{Q}}}", {"s": "", "u": "Zürich 東京"}),
    (f'{{s:{Q}line\nbreak \\n "quoted" \\{Q}}}', {"s": 'line\nbreak \\n "quoted" \\'}),
    (f"{{deep:{{a:[{{b:[[{Q}c{Q}]]}}]}}}}", {"deep": {"a": [{"b": [["c"]]}]}}),
    ("{big:123456789012345678901234567890}", {"big": 123456789012345678901234567890}),
]


@pytest.mark.parametrize(("text", "value"), READ)
def test_reads_gemma_values(text: str, value: dict[str, Any]) -> None:
    assert read_gemma4_arguments(text) == (value, "")
    assert read_gemma4_arguments(text + " tail") == (value, " tail")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{a:1", "expected ',' or '}', found the end at character 4"),
        ("{a 1}", "expected ':', found '}'"),
        ("{a:1,}", "expected a key at character 5"),
        ("{a:1,a:2}", "the key 'a' is given twice"),
        (f"{{a:{Q}x}}", f"a string opened with {Q} is never closed"),
        ("{a:yes}", "'yes' is not a number, true, false or null"),
        ("{a:01}", "'01' is not a number"),
        ("{a:1e999}", "the number '1e999' is too large"),
        ("{a:}", "expected a value, found '}'"),
        ('{a:"open}', "a quoted string is not valid JSON"),
        ("{a:[1 2]}", "expected ',' or ']', found '2'"),
        ("[1]", "expected '{', found '['"),
    ],
)
def test_unreadable_arguments_say_where(text: str, message: str) -> None:
    with pytest.raises(MarkupError, match="^" + message.replace("[", "\\[").replace("]", "\\]")):
        read_gemma4_arguments(text)


def written(value: Any) -> str:
    """``value`` as the Gemma 4 chat template writes tool-call arguments (``format_argument``
    with bare keys in sorted order)."""
    if isinstance(value, str):
        return Q + value + Q
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{written(v)}" for k, v in sorted(value.items(), key=lambda kv: kv[0].lower())) + "}"
    if isinstance(value, list):
        return "[" + ",".join(written(v) for v in value) + "]"
    return json.dumps(value)


KEYS = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12).filter(lambda s: Q not in s)
)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4))


@settings(max_examples=300, deadline=None)
@given(arguments=st.dictionaries(KEYS, VALUES, max_size=5))
def test_what_the_template_writes_reads_back(arguments: dict[str, Any]) -> None:
    assert read_gemma4_arguments(written(arguments)) == (arguments, "")


# --- whole turns, streamed ---------------------------------------------------------------------

TURN = (
    "<|channel>thought\nThe user wants weather; maybe <|tool_call>call:get_time{}<tool_call|> too.\n<channel|>"
    f"Checking both.\n<|tool_call>call:get_weather{{city:{Q}Rome, {{Lazio}}{Q},days:3}}<tool_call|>"
    f"<|tool_call>call:get_time{{zone:{Q}UTC{Q}}}<tool_call|>"
)


def test_a_thinking_turn_with_parallel_calls_streams_at_every_character() -> None:
    args = {"reasoning_parser": "gemma4", "tool_parser": "gemma4", "tools": TOOLS}
    message = OutputParser.parse(TURN, **args)
    assert message.reasoning == "The user wants weather; maybe <|tool_call>call:get_time{}<tool_call|> too."
    assert message.content == "Checking both."
    assert [(c.name, json.loads(c.arguments)) for c in message.tool_calls] == [
        ("get_weather", {"city": "Rome, {Lazio}", "days": 3}),
        ("get_time", {"zone": "UTC"}),
    ]
    assert message.problems == []
    for cut in range(len(TURN) + 1):
        check_streams_like_whole([TURN[:cut], TURN[cut:]], **args)
    check_streams_like_whole(list(TURN), **args)


GEMMA_MARKUP = [Q, "<|tool_call>", "<tool_call|>", "call:get_time", "zone:", "<|channel>", "thought", "<channel|>"]


@settings(max_examples=200, deadline=None)
@given(
    text=st.lists(st.sampled_from([*'ab ,:{}[]"\n', *GEMMA_MARKUP]), max_size=40).map("".join),
    cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=20),
)
def test_gemma_markup_soup_never_crashes_and_streams_like_the_whole(text: str, cuts: list[int]) -> None:
    args = {"tool_parser": "gemma4", "tools": TOOLS, "reasoning_parser": "gemma4"}
    message = check_streams_like_whole(split(text, cuts), **args)
    if not message.problems:  # every call region was honoured: none of its markup is content
        assert "<|tool_call>" not in message.content


# --- constrained decoding ----------------------------------------------------------------------

CONFIGURE = ToolDefinition(  # every value bounded, so random walks end quickly
    "configure",
    parameters={
        "type": "object",
        "properties": {
            "Zeta": {"type": "integer"},
            "alpha": {"type": "number"},
            "mode": {"enum": ["fast", "slow, careful", 3]},
            "flags": {"type": "array", "items": {"type": "boolean"}, "minItems": 1},
            "limits": {
                "type": "object",
                "properties": {"low": {"type": "integer"}, "high": {"type": ["integer", "null"]}},
                "required": ["high"],
                "additionalProperties": False,
            },
            "level": {"anyOf": [{"const": "max"}, {"type": "integer"}]},
            "weird key": {"type": "boolean"},
            "empty": {"type": "object", "properties": {}, "additionalProperties": False},
        },
        "required": ["mode", "limits"],
        "additionalProperties": False,
    },
)
RESET = ToolDefinition("reset", parameters={"type": "object", "properties": {}, "additionalProperties": False})
TALLY = ToolDefinition(
    "tally",
    parameters={
        "type": "object",
        "properties": {"counts": {"type": "object", "additionalProperties": {"type": "integer"}}, "note": {}},
    },
)


@TOKENIZERS
@pytest.mark.parametrize("choice", ["required", {"name": "configure"}])
def test_every_call_the_grammar_allows_parses_and_validates(tokenizer, choice) -> None:
    tools = [CONFIGURE, RESET]
    parallel = choice == "required"
    structured = tool_call_constraint("gemma4", tools, choice, tokenizer=tokenizer, parallel_tool_calls=parallel)
    rng = random.Random(f"gemma4-{choice}")
    names = set()
    for _ in range(25):
        text = random_walk(structured, rng, tokenizer=tokenizer)
        message = OutputParser.parse(text, tool_parser="gemma4", tools=tools, tool_choice=choice)
        assert message.problems == [], (text, message.problems)
        assert message.content == "" and message.tool_calls, text
        names |= {c.name for c in message.tool_calls}
    assert names == ({"configure", "reset"} if parallel else {"configure"})


@TOKENIZERS
def test_the_grammar_writes_calls_the_way_the_template_does(tokenizer) -> None:
    structured = tool_call_constraint("gemma4", TOOLS, "required", tokenizer=tokenizer)

    def call(arguments: str) -> str:
        return f"<|tool_call>call:get_weather{{{arguments}}}<tool_call|>"

    assert accepts(structured, call(f'city:{Q}Paris, "TX" {{x}}: [y]{Q},days:3,options:{{hourly:true}}'), tokenizer)
    assert accepts(structured, call(f"city:{Q}{Q}") + call(f"city:{Q}Rome{Q},metric:false"), tokenizer)
    assert not accepts(structured, call(f"city:{Q}Rome{Q},days:{Q}3{Q}"), tokenizer)  # a string for an integer
    assert not accepts(structured, call("days:3"), tokenizer)  # city is required
    assert not accepts(structured, call(f"days:3,city:{Q}Rome{Q}"), tokenizer)  # keys in sorted order
    assert not accepts(structured, call(f"city:{Q}Rome{Q}, days:3"), tokenizer)  # no whitespace
    assert not accepts(structured, call(f"city:{Q}Rome{Q},unknown:1"), tokenizer)  # only declared keys

    tally = tool_call_constraint("gemma4", [TALLY], "required", tokenizer=tokenizer)
    arguments = f"counts:{{a:1,b_2:-3}},note:[{Q}x{Q},{{y:null}}]"
    assert accepts(tally, f"<|tool_call>call:tally{{{arguments}}}<tool_call|>", tokenizer)
    assert accepts(tally, "<|tool_call>call:tally{}<tool_call|>", tokenizer)
    assert not accepts(tally, f"<|tool_call>call:tally{{counts:{{a:{Q}1{Q}}}}}<tool_call|>", tokenizer)


def test_special_token_markers_and_thinking() -> None:
    assert needs_special_tokens(GEMMA_TOKENIZER, tool_parser="gemma4")
    assert needs_special_tokens(GEMMA_TOKENIZER, reasoning_parser="gemma4")
    assert not needs_special_tokens(TEXT_TOKENIZER, reasoning_parser="gemma4", tool_parser="gemma4")
    token = GEMMA_TOKENIZER.backend.token_to_id
    grammar = tool_call_constraint("gemma4", TOOLS, "required", tokenizer=GEMMA_TOKENIZER).grammar
    assert all(f"<[{token(marker)}]>" in grammar for marker in (Q, "<|tool_call>", "<tool_call|>"))

    call = f"<|tool_call>call:get_time{{zone:{Q}UTC{Q}}}<tool_call|>"
    prompt = "<|turn>system\n<|think|>\n<turn|>\n<|turn>user\nTime?<turn|>\n<|turn>model\n"
    thinking = tool_call_constraint(
        "gemma4", TOOLS, "required", tokenizer=GEMMA_TOKENIZER, reasoning_parser="gemma4", prompt_text=prompt
    )
    assert accepts(thinking, "<|channel>thought\nUTC, then.<channel|>" + call, GEMMA_TOKENIZER)
    assert accepts(thinking, call, GEMMA_TOKENIZER)
    assert not accepts(thinking, "UTC, then.<channel|>" + call, GEMMA_TOKENIZER)

    budget = thinking_budget("gemma4", GEMMA_TOKENIZER, prompt, 64)
    assert budget.start_token_ids == (token("<|channel>"),)
    assert budget.close_token_ids == (token("<channel|>"),)
    assert thinking_budget("gemma4", GEMMA_TOKENIZER, prompt + "<|channel>thought\n", 64).start_token_ids == ()
