"""The official ``anthropic`` SDK against live servers: messages, the SSE event sequence, count_tokens,
tool use, thinking, stop sequences."""

from __future__ import annotations

from tests.server.conftest import ScriptedFactory
from tests.server.live import LiveServer

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
SCRIPTS = {
    "[weather]": (
        "<think>\nThe user wants weather.\n</think>\n\nChecking.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    ),
    "(result of toolu_1)": "It is sunny in Paris.",
    "[count]": "one, two, three, four",
}


def test_message(smol: LiveServer) -> None:
    message = smol.anthropic().messages.create(
        model="smollm2", max_tokens=24, messages=QUESTION, extra_body={"temperature": 0}
    )
    assert message.content[0].type == "text"
    assert message.content[0].text == "The capital of France is Paris."
    assert message.stop_reason == "end_turn"
    assert message.role == "assistant" and message.model == "smollm2"
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0


def test_message_stream_event_sequence(smol: LiveServer) -> None:
    with smol.anthropic().messages.stream(
        model="smollm2", max_tokens=5, messages=QUESTION, system="Be brief.", extra_body={"temperature": 0}
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [event.type for event in events]
    assert kinds[:2] == ["message_start", "content_block_start"] or kinds[:3] == [
        "message_start",
        "ping",
        "content_block_start",
    ]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    raw = [
        k
        for k in kinds
        if k
        in (
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        )
    ]
    assert raw.count("message_start") == raw.count("content_block_start") == raw.count("content_block_stop") == 1
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 5
    assert final.content[0].text == "".join(e.delta.text for e in events if e.type == "content_block_delta")


def test_count_tokens(smol: LiveServer) -> None:
    sdk = smol.anthropic()
    counted = sdk.messages.count_tokens(model="smollm2", messages=QUESTION)
    message = sdk.messages.create(model="smollm2", max_tokens=1, messages=QUESTION)
    assert counted.input_tokens == message.usage.input_tokens > 0


def test_stop_sequences(scripted: ScriptedFactory) -> None:
    sdk = scripted(SCRIPTS).anthropic()
    message = sdk.messages.create(
        model="scripted",
        max_tokens=50,
        messages=[{"role": "user", "content": "[count]"}],
        stop_sequences=["three"],
        extra_body={"temperature": 0},
    )
    assert message.content[0].text == "one, two, "
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "three"


def test_tool_use_and_thinking(scripted: ScriptedFactory) -> None:
    sdk = scripted(SCRIPTS, tool_call_parser="hermes", reasoning_parser="qwen3").anthropic()
    request = {
        "model": "scripted",
        "max_tokens": 200,
        "tools": [WEATHER_TOOL],
        "extra_body": {"temperature": 0},
        "messages": [{"role": "user", "content": "[weather] in Paris?"}],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }
    message = sdk.messages.create(**request)
    assert [block.type for block in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[0].thinking == "The user wants weather."
    assert message.content[1].text == "Checking."
    assert message.content[2].name == "get_weather" and message.content[2].input == {"city": "Paris"}
    assert message.stop_reason == "tool_use"

    with sdk.messages.stream(**request) as stream:
        events = list(stream)
        final = stream.get_final_message()
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use"]
    deltas = {e.delta.type for e in events if e.type == "content_block_delta"}
    assert deltas == {"thinking_delta", "text_delta", "input_json_delta"}
    assert [(b.type, getattr(b, "input", None)) for b in final.content] == [
        (b.type, getattr(b, "input", None)) for b in message.content
    ]
    assert "tool_call" not in "".join(
        e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )


def test_tool_result_round_trip(scripted: ScriptedFactory) -> None:
    sdk = scripted(SCRIPTS, tool_call_parser="hermes").anthropic()
    message = sdk.messages.create(
        model="scripted",
        max_tokens=50,
        tools=[WEATHER_TOOL],
        extra_body={"temperature": 0},
        messages=[
            {"role": "user", "content": "[weather] in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny, 24 C"}]},
        ],
    )
    assert message.content[0].text == "It is sunny in Paris." and message.stop_reason == "end_turn"


def test_thinking_switch_reaches_the_template(scripted: ScriptedFactory) -> None:
    sdk = scripted(SCRIPTS, reasoning_parser="qwen3").anthropic()
    enabled = sdk.messages.count_tokens(
        model="scripted", messages=QUESTION, thinking={"type": "enabled", "budget_tokens": 1024}
    )
    disabled = sdk.messages.count_tokens(model="scripted", messages=QUESTION, thinking={"type": "disabled"})
    assert disabled.input_tokens > enabled.input_tokens  # the template wrote an empty think block


def test_system_turns_inside_messages_and_json_output(scripted: ScriptedFactory) -> None:
    sdk = scripted({"[count]": "one, two", "[json]": '{"n": 2}'}).anthropic()
    message = sdk.messages.create(
        model="scripted",
        max_tokens=20,
        messages=[{"role": "system", "content": "Count."}, {"role": "user", "content": "[count]"}],  # type: ignore[list-item]
    )
    assert message.content[0].text == "one, two"
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    message = sdk.messages.create(
        model="scripted",
        max_tokens=20,
        messages=[{"role": "user", "content": "[json]"}],
        output_config={"format": {"type": "json_schema", "schema": schema}, "effort": "low"},
        thinking={"type": "adaptive"},
    )
    assert message.content[0].text == '{"n": 2}'
