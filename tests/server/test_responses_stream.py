"""Streamed ``/v1/responses`` through the official ``openai`` SDK (``client.responses.stream`` and
``create(stream=True)``): the typed event sequence, sequence numbers, reasoning and function-call
events, the incomplete ending, and that a streamed response equals the whole one."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.server.conftest import ScriptedFactory
from tests.server.test_responses_api import SCRIPTS, WEATHER


@pytest.fixture(scope="module")
def sdk(scripted: ScriptedFactory) -> openai.OpenAI:
    return scripted(SCRIPTS, tool_call_parser="hermes", reasoning_parser="qwen3").openai()


def _events(sdk: openai.OpenAI, **request: Any) -> list[Any]:
    return list(sdk.responses.create(model="scripted", stream=True, **request))


def test_text_event_sequence(sdk: openai.OpenAI) -> None:
    with sdk.responses.stream(model="scripted", input="[hello]") as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert kinds[-5:] == [
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hi there."
    assert final.output_text == "Hi there." and final.status == "completed"
    assert events[0].response.status == "in_progress" and events[0].response.id == final.id
    assert sdk.responses.retrieve(final.id).output_text == "Hi there."  # stored once completed


def test_reasoning_and_function_call_events(sdk: openai.OpenAI) -> None:
    events = _events(sdk, input="[think]")
    kinds = [e.type for e in events]
    assert "response.reasoning_text.delta" in kinds and "response.reasoning_text.done" in kinds
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert reasoning.strip() == "The user greets me."
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [item.type for item in done] == ["reasoning", "message"]
    assert events[-1].type == "response.completed"
    assert events[-1].response.usage.output_tokens_details.reasoning_tokens > 0

    events = _events(sdk, input="[weather]", tools=[WEATHER])
    added = [e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    assert len(added) == 1 and added[0].item.name == "get_weather" and added[0].item.arguments == ""
    fragments = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    [arguments_done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads("".join(fragments)) == json.loads(arguments_done.arguments) == {"city": "Paris"}
    assert all(e.output_index == added[0].output_index for e in events if "function_call_arguments" in e.type)
    final = events[-1].response
    assert [item.type for item in final.output] == ["message", "function_call"]
    assert final.output[1].call_id == added[0].item.call_id


def test_stream_matches_the_whole_response(sdk: openai.OpenAI) -> None:
    for request in (
        {"input": "[think]"},
        {"input": "[weather]", "tools": [WEATHER]},
        {"input": "[two]", "tools": [WEATHER]},
    ):
        whole = sdk.responses.create(model="scripted", **request)  # type: ignore[call-overload]
        streamed = _events(sdk, **request)[-1].response

        def shape(items: list[Any]) -> list[tuple[Any, ...]]:
            return [(i.type, getattr(i, "name", None), getattr(i, "arguments", None)) for i in items]

        assert shape(streamed.output) == shape(whole.output)
        assert streamed.output_text == whole.output_text
        assert streamed.usage.output_tokens == whole.usage.output_tokens


def test_incomplete_stream(sdk: openai.OpenAI) -> None:
    events = _events(sdk, input="[count]", max_output_tokens=3)
    last = events[-1]
    assert last.type == "response.incomplete" and last.response.status == "incomplete"
    assert last.response.incomplete_details.reason == "max_output_tokens"
    assert [e.item.status for e in events if e.type == "response.output_item.done"] == ["incomplete"]


def test_stream_continues_a_stored_response(sdk: openai.OpenAI) -> None:
    first = _events(sdk, input="[hello]")[-1].response
    with sdk.responses.stream(model="scripted", input="again", previous_response_id=first.id) as stream:
        assert stream.get_final_response().output_text == "Hi again."


def test_an_error_after_the_stream_began_is_an_error_event(scripted: ScriptedFactory) -> None:
    sdk = scripted(SCRIPTS, delay_s=0.05, request_timeout=0.4).openai()
    events = _events(sdk, input="[count]")
    assert events[0].type == "response.created" and events[-1].type == "error"
    assert "request timeout" in events[-1].message
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_encrypted_reasoning_items_are_accepted(sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(
        model="scripted",
        input=[
            {"role": "user", "content": "[hello]"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Hi there."}]},
            {"role": "user", "content": "again"},
        ],
    )
    assert response.output_text == "Hi again."
