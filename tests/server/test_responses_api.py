"""``/v1/responses`` through the official ``openai`` SDK (``client.responses``) on scripted models:
text, instructions, structured output, reasoning, tool calls and their results, the store
(``previous_response_id``, retrieve, delete, eviction) and the token limit."""

from __future__ import annotations

import json

import openai
import pytest

from tests.server.conftest import ScriptedFactory
from tests.server.live import LiveServer

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
SCRIPTS = {
    "[hello]": "Hi there.",
    "Hi there.<|im_end|>\n<|im_start|>user\nagain": "Hi again.",
    "[terse]": "Yes.",
    "[weather]": 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "(result of call_": "It is sunny in Paris.",
    "[two]": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>',
    "[think]": "<think>\nThe user greets me.\n</think>\n\nHello!",
    "[json]": '{"city": "Paris", "population": 2102650}',
    "[prose]": "Paris is a big city.",
    "[count]": "one, two, three, four, five, six, seven, eight",
}


@pytest.fixture(scope="module")
def sdk(scripted: ScriptedFactory) -> openai.OpenAI:
    return scripted(SCRIPTS, tool_call_parser="hermes", reasoning_parser="qwen3").openai()


def test_text_input(sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(model="scripted", input="[hello]", temperature=0)
    assert response.output_text == "Hi there."
    assert response.status == "completed" and response.object == "response" and response.id.startswith("resp_")
    [message] = response.output
    assert message.type == "message" and message.role == "assistant" and message.status == "completed"
    assert message.content[0].type == "output_text"
    usage = response.usage
    assert usage is not None and usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert usage.input_tokens_details.cached_tokens >= 0


def test_message_items_and_instructions(sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(
        model="scripted",
        instructions="[terse]",
        input=[
            {"role": "developer", "content": "Answer in one word."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Is Paris in France?"}]},
        ],
    )
    assert response.output_text == "Yes." and response.instructions == "[terse]"


def test_structured_output(sdk: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city"],
    }
    fmt = {"type": "json_schema", "name": "city", "schema": schema, "strict": True}
    response = sdk.responses.create(model="scripted", input="[json]", text={"format": fmt})  # type: ignore[typeddict-item]
    assert json.loads(response.output_text) == {"city": "Paris", "population": 2102650}
    assert response.text is not None and response.text.format is not None and response.text.format.type == "json_schema"
    # the script wants prose; the grammar only lets JSON through
    forced = sdk.responses.create(
        model="scripted", input="[prose]", text={"format": {"type": "json_object"}}, max_output_tokens=8, temperature=0
    )
    text = forced.output_text.lstrip()  # a JSON object's start: nothing yet but whitespace, or "{"...
    assert (not text or text.startswith("{")) and "Paris" not in forced.output_text


def test_reasoning_item(sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(model="scripted", input="[think]")
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert reasoning.content[0].text.strip() == "The user greets me."
    assert message.type == "message" and response.output_text == "Hello!"
    assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens > 0


def test_tool_call_and_result_round_trip(sdk: openai.OpenAI) -> None:
    first = sdk.responses.create(model="scripted", input="[weather] in Paris?", tools=[WEATHER])  # type: ignore[list-item]
    message, call = first.output
    assert message.type == "message" and first.output_text == "Checking."
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"} and call.call_id.startswith("call_")
    assert [t.name for t in first.tools] == ["get_weather"] and first.tool_choice == "auto"

    # the client sends the whole conversation back, with the tool's result
    second = sdk.responses.create(
        model="scripted",
        input=[
            {"role": "user", "content": "[weather] in Paris?"},
            *[item.model_dump(exclude_none=True) for item in first.output],  # type: ignore[misc]
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24 C"},
        ],
        tools=[WEATHER],  # type: ignore[list-item]
        store=False,
    )
    assert second.output_text == "It is sunny in Paris." and not second.store

    # or only the result, continuing the stored response
    third = sdk.responses.create(
        model="scripted",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24 C"}],
        tools=[WEATHER],  # type: ignore[list-item]
    )
    assert third.output_text == "It is sunny in Paris." and third.previous_response_id == first.id
    assert third.usage is not None and second.usage is not None
    assert third.usage.input_tokens == second.usage.input_tokens  # the same conversation either way


def test_parallel_tool_calls_off(sdk: openai.OpenAI) -> None:
    both = sdk.responses.create(model="scripted", input="[two]", tools=[WEATHER])  # type: ignore[list-item]
    assert [json.loads(item.arguments) for item in both.output if item.type == "function_call"] == [
        {"city": "Paris"},
        {"city": "Rome"},
    ]
    one = sdk.responses.create(model="scripted", input="[two]", tools=[WEATHER], parallel_tool_calls=False)  # type: ignore[list-item]
    assert [json.loads(item.arguments) for item in one.output if item.type == "function_call"] == [{"city": "Paris"}]


def test_named_tool_choice_forces_the_call(sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(
        model="scripted",
        input="[two]",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and json.loads(calls[0].arguments) == {"city": "Paris"}
    assert response.tool_choice.type == "function" and response.tool_choice.name == "get_weather"  # type: ignore[union-attr]


def test_previous_response_id_continues_the_conversation(sdk: openai.OpenAI) -> None:
    first = sdk.responses.create(model="scripted", input="[hello]")
    second = sdk.responses.create(model="scripted", previous_response_id=first.id, input="again, please")
    assert second.output_text == "Hi again."  # the stored turn, answer included, is in the prompt
    assert sdk.responses.retrieve(second.id).output_text == "Hi again."


def test_retrieve_delete_and_store_false(sdk: openai.OpenAI) -> None:
    kept = sdk.responses.create(model="scripted", input="[hello]")
    assert sdk.responses.retrieve(kept.id).id == kept.id
    sdk.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.delete(kept.id)
    unstored = sdk.responses.create(model="scripted", input="[hello]", store=False)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(unstored.id)


def test_the_store_drops_the_least_recently_used(scripted: ScriptedFactory) -> None:
    sdk = scripted(SCRIPTS, responses_store_size=2).openai()
    a, b = (sdk.responses.create(model="scripted", input="[hello]") for _ in range(2))
    sdk.responses.retrieve(a.id)  # a is now the most recently used
    sdk.responses.create(model="scripted", input="[hello]")
    assert sdk.responses.retrieve(a.id).id == a.id
    with pytest.raises(openai.NotFoundError, match="dropped"):
        sdk.responses.retrieve(b.id)


def test_max_output_tokens_makes_it_incomplete(sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(model="scripted", input="[count]", max_output_tokens=3)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 3
    assert response.output[-1].type == "message" and response.output[-1].status == "incomplete"


def test_stop_and_sampler_extensions(sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(
        model="scripted", input="[count]", temperature=0, top_p=0.9, extra_body={"stop": [", three"], "top_k": 5}
    )
    assert response.output_text == "one, two" and response.status == "completed"


def test_real_text(smol: LiveServer) -> None:
    response = smol.openai().responses.create(
        model="smollm2", input="What is the capital of France?", temperature=0, max_output_tokens=24
    )
    assert response.output_text == "The capital of France is Paris." and response.status == "completed"
