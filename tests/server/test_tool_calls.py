"""Tool calls and reasoning end to end: scripted model outputs in the markup of each of core's parsers,
parsed by the server and returned through the ``openai`` and ``anthropic`` SDKs, streamed and not
(a plugin's parsers: `test_parser_plugins.py`)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from atlas_core.builtin_plugin import CORE_TOOL_PARSERS
from tests.server.conftest import ScriptedFactory

ROME3 = ("get_weather", {"city": "Rome", "days": 3})
UTC = ("get_time", {"zone": "UTC"})
PARIS = ("get_weather", {"city": "Paris"})

# parser -> (scripted output, visible content, calls)
OUTPUTS: dict[str, tuple[str, str, list[tuple[str, dict[str, Any]]]]] = {
    "hermes": (
        'Checking both.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 3}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>',
        "Checking both.",
        [ROME3, UTC],
    ),
    "qwen3_coder": (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
        "</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>",
        "",
        [ROME3, UTC],
    ),
    "mistral": (
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome", "days": 3}[TOOL_CALLS]get_time[ARGS]{"zone": "UTC"}',
        "",
        [ROME3, UTC],
    ),
    "json": ('{"name": "get_weather", "arguments": {"city": "Paris"}}', "", [PARIS]),
    "nemotron": (
        '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Rome", "days": 3}}, '
        '{"name": "get_time", "arguments": {"zone": "UTC"}}]</TOOLCALL>',
        "",
        [ROME3, UTC],
    ),
}
MARKERS = ["<tool_call>", "[TOOL_CALLS]", "<TOOLCALL>", '"name"', "<function="]

FUNCTIONS = [
    {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
    {
        "name": "get_time",
        "description": "Time in a zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
    },
]
OPENAI_TOOLS = [{"type": "function", "function": f} for f in FUNCTIONS]
ANTHROPIC_TOOLS = [
    {"name": f["name"], "description": f["description"], "input_schema": f["parameters"]} for f in FUNCTIONS
]
ASK = [{"role": "user", "content": "[ask] weather in Rome and the time?"}]


def test_every_core_parser_is_covered() -> None:
    assert sorted(OUTPUTS) == sorted(CORE_TOOL_PARSERS)


@pytest.mark.parametrize("parser", sorted(OUTPUTS))
def test_openai_tool_calls(scripted: ScriptedFactory, parser: str) -> None:
    text, content, calls = OUTPUTS[parser]
    server = scripted({"[ask]": text}, tool_call_parser=parser)
    sdk = server.openai()

    whole = sdk.chat.completions.create(model="scripted", messages=ASK, tools=OPENAI_TOOLS, temperature=0)
    message = whole.choices[0].message
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == calls
    assert (message.content or "") == content
    assert whole.choices[0].finish_reason == "tool_calls"
    assert len({c.id for c in message.tool_calls}) == len(calls)

    chunks = list(
        sdk.chat.completions.create(model="scripted", messages=ASK, tools=OPENAI_TOOLS, temperature=0, stream=True)
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    streamed_content = "".join(d.content or "" for d in deltas)
    assert streamed_content == content and not any(marker in streamed_content for marker in MARKERS)
    starts = [tc for d in deltas for tc in d.tool_calls or [] if tc.id]
    assert [(tc.index, tc.function.name) for tc in starts] == [(i, name) for i, (name, _) in enumerate(calls)]
    assert all(tc.function.arguments == "" for tc in starts)  # id and name first, arguments after
    arguments = dict.fromkeys(range(len(calls)), "")
    for d in deltas:
        for tc in d.tool_calls or []:
            arguments[tc.index] += tc.function.arguments or ""
    assert [json.loads(arguments[i]) for i in range(len(calls))] == [args for _, args in calls]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


@pytest.mark.parametrize("parser", ["hermes", "qwen3_coder"])
def test_anthropic_tool_use_streams_input_json(scripted: ScriptedFactory, parser: str) -> None:
    text, content, calls = OUTPUTS[parser]
    server = scripted({"[ask]": text}, tool_call_parser=parser)
    sdk = server.anthropic()
    with sdk.messages.stream(model="scripted", max_tokens=300, messages=ASK, tools=ANTHROPIC_TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == calls
    assert "".join(b.text for b in final.content if b.type == "text") == content
    assert final.stop_reason == "tool_use"
    fragments = [
        e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert len(fragments) >= len(calls)


def test_parallel_tool_calls_off_keeps_the_first(scripted: ScriptedFactory) -> None:
    server = scripted({"[ask]": OUTPUTS["hermes"][0]}, tool_call_parser="hermes")
    sdk = server.openai()
    whole = sdk.chat.completions.create(model="scripted", messages=ASK, tools=OPENAI_TOOLS, parallel_tool_calls=False)
    assert [c.function.name for c in whole.choices[0].message.tool_calls] == ["get_weather"]
    chunks = list(
        sdk.chat.completions.create(
            model="scripted", messages=ASK, tools=OPENAI_TOOLS, parallel_tool_calls=False, stream=True
        )
    )
    indices = {tc.index for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []}
    assert indices == {0}


def test_tool_choice_none_leaves_markup_as_text(scripted: ScriptedFactory) -> None:
    text = OUTPUTS["hermes"][0]
    server = scripted({"[ask]": text}, tool_call_parser="hermes")
    sdk = server.openai()
    whole = sdk.chat.completions.create(model="scripted", messages=ASK, tools=OPENAI_TOOLS, tool_choice="none")
    assert whole.choices[0].message.tool_calls is None
    assert whole.choices[0].message.content == text and whole.choices[0].finish_reason == "stop"


def test_tools_reach_the_chat_template(scripted: ScriptedFactory) -> None:
    server = scripted({"[ask]": "ok"}, tool_call_parser="hermes")
    body = {"messages": ASK, "tools": OPENAI_TOOLS}
    tokens = httpx.post(server.url + "/tokenize", json=body).json()["tokens"]
    rendered = server.state.runtime.tokenizer.decode(tokens, skip_special_tokens=False)
    assert '"name": "get_weather"' in rendered and "# Tools" in rendered


REASONED = "<think>\nSix times seven.\n</think>\n\nThe answer is 42."


def test_reasoning_split_openai(scripted: ScriptedFactory) -> None:
    server = scripted({"[q]": REASONED}, reasoning_parser="qwen3")
    sdk = server.openai()
    messages = [{"role": "user", "content": "[q] 6 x 7?"}]
    whole = sdk.chat.completions.create(model="scripted", messages=messages)
    message = whole.choices[0].message
    assert message.content == "The answer is 42."
    assert message.model_extra["reasoning_content"] == "Six times seven."
    chunks = list(sdk.chat.completions.create(model="scripted", messages=messages, stream=True))
    reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks if c.choices
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert (reasoning, content) == ("Six times seven.", "The answer is 42.")


def test_reasoning_history_is_sent_back_to_the_template(scripted: ScriptedFactory) -> None:
    server = scripted(
        {"[q]": REASONED, "<think>Six times seven.</think>The answer is 42.": "Glad to help."}, reasoning_parser="qwen3"
    )
    sdk = server.openai()
    messages = [
        {"role": "user", "content": "[q] 6 x 7?"},
        {"role": "assistant", "content": "The answer is 42.", "reasoning_content": "Six times seven."},
        {"role": "user", "content": "thanks"},
    ]
    whole = sdk.chat.completions.create(model="scripted", messages=messages)
    assert whole.choices[0].message.content == "Glad to help."
