"""Constrained decoding and thinking budgets end to end through the engine, on SmolLM2-135M."""

from __future__ import annotations

import json

import jsonschema
import pytest

from atlas_core import SamplingParams
from atlas_core.engine.config import EngineConfig
from atlas_core.engine.llm_engine import LLMEngine
from atlas_core.errors import InvalidRequestError
from atlas_core.parsing import (
    OutputParser,
    StructuredOutput,
    ThinkingBudget,
    ToolDefinition,
    response_format_constraint,
    tool_call_constraint,
)

pytestmark = pytest.mark.slow

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER = ToolDefinition(
    "get_weather",
    "Current weather for a city",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 30},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    },
)
TIME = ToolDefinition(
    "get_time",
    "Current time in a zone",
    {
        "type": "object",
        "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["zone"],
        "additionalProperties": False,
    },
)
TOOLS = [WEATHER, TIME]


def chat_prompt(llm, question: str, tools=None) -> dict:
    openai_tools = [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in tools or []
    ]
    text = llm.tokenizer.apply_chat_template([{"role": "user", "content": question}], tools=openai_tools or None)
    return {"prompt": text, "prompt_token_ids": llm.tokenizer.encode(text, add_special_tokens=False)}


def test_json_schema_output_parses_and_validates(default_llm) -> None:
    structured = response_format_constraint(
        {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}, tokenizer=default_llm.tokenizer
    )
    prompt = chat_prompt(default_llm, "Describe a person.")
    greedy = default_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=60, structured=structured))[
        0
    ].outputs[0]
    sampled = default_llm.generate(
        prompt, SamplingParams(temperature=1.0, seed=3, n=3, max_tokens=60, structured=structured)
    )[0]
    for output in [greedy, *sampled.outputs]:
        assert output.finish_reason == "stop", output.text
        jsonschema.validate(json.loads(output.text), PERSON)
    any_object = default_llm.generate(
        prompt, SamplingParams(temperature=0, max_tokens=60, structured=StructuredOutput.json())
    )[0]
    assert isinstance(json.loads(any_object.outputs[0].text), dict)


@pytest.mark.parametrize("choice", ["required", {"name": "get_time"}])
def test_tool_choice_yields_a_parseable_call(default_llm, choice) -> None:
    single = isinstance(choice, dict)  # the small model would repeat the call up to max_tokens
    structured = tool_call_constraint(
        "hermes", TOOLS, choice, tokenizer=default_llm.tokenizer, parallel_tool_calls=not single
    )
    prompt = chat_prompt(default_llm, "What is the weather in Paris this week?", TOOLS)
    output = default_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=80, structured=structured))[
        0
    ].outputs[0]
    assert output.finish_reason == "stop", output.text
    message = OutputParser.parse(output.text, tool_parser="hermes", tools=TOOLS, tool_choice=choice)
    assert message.problems == [] and message.content == ""
    assert message.tool_calls
    if single:
        assert [c.name for c in message.tool_calls] == ["get_time"]


def test_rows_without_constraints_are_unchanged(default_llm) -> None:
    plain = chat_prompt(default_llm, "What is the capital of France?")
    params = SamplingParams(temperature=0, max_tokens=12)
    alone = default_llm.generate(plain, params)[0].outputs[0].token_ids
    structured = response_format_constraint({"type": "json_object"}, tokenizer=default_llm.tokenizer)
    constrained = SamplingParams(temperature=0, max_tokens=12, structured=structured)
    budgeted = SamplingParams(temperature=0, max_tokens=12, thinking_budget=ThinkingBudget(2, (28,)))
    outputs = default_llm.generate([plain, plain, plain, plain], [constrained, params, budgeted, params])
    assert outputs[1].outputs[0].token_ids == alone == outputs[3].outputs[0].token_ids
    assert outputs[0].outputs[0].token_ids != alone
    assert outputs[0].outputs[0].text.startswith("{")
    assert outputs[2].outputs[0].token_ids[2] == 28


def test_thinking_budget_forces_the_close_marker(default_llm) -> None:
    tokenizer = default_llm.tokenizer
    close = tuple(tokenizer.encode("\n</think>\n\n", add_special_tokens=False))
    prompt = chat_prompt(default_llm, "Think about the number seven.")
    prompt = {
        "prompt": prompt["prompt"] + "<think>\n",
        "prompt_token_ids": prompt["prompt_token_ids"] + tokenizer.encode("<think>\n", add_special_tokens=False),
    }
    budget = ThinkingBudget(
        max_tokens=6, end_token_ids=close, close_token_ids=tuple(tokenizer.encode("</think>", add_special_tokens=False))
    )
    output = default_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=20, thinking_budget=budget))[
        0
    ].outputs[0]
    assert tuple(output.token_ids[6 : 6 + len(close)]) == close
    message = OutputParser.parse(output.text, reasoning_parser="qwen3", prompt_text=prompt["prompt"])
    assert message.reasoning == tokenizer.decode(output.token_ids[:6]).strip()
    # counting starts only once the opening marker appears
    opening = tuple(tokenizer.encode("<think>", add_special_tokens=False))
    late = ThinkingBudget(max_tokens=3, end_token_ids=close, start_token_ids=opening)
    free = default_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=20, thinking_budget=late))[0].outputs[
        0
    ]
    plain = default_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=20))[0].outputs[0]
    assert free.token_ids == plain.token_ids


def test_thinking_budget_then_constrained_answer(default_llm) -> None:
    tokenizer = default_llm.tokenizer
    prompt_text = chat_prompt(default_llm, "Describe a person.")["prompt"] + "<think>\n"
    prompt = {"prompt": prompt_text, "prompt_token_ids": tokenizer.encode(prompt_text, add_special_tokens=False)}
    structured = response_format_constraint(
        {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
        tokenizer=tokenizer,
        reasoning_parser="qwen3",
        prompt_text=prompt_text,
    )
    from atlas_core.parsing import thinking_budget

    budget = thinking_budget("qwen3", tokenizer, prompt_text, 8)
    output = default_llm.generate(
        prompt, SamplingParams(temperature=0, max_tokens=80, structured=structured, thinking_budget=budget)
    )[0].outputs[0]
    assert output.finish_reason == "stop", output.text
    message = OutputParser.parse(output.text, reasoning_parser="qwen3", prompt_text=prompt_text)
    assert message.reasoning
    jsonschema.validate(json.loads(message.content), PERSON)


def test_preemption_replays_into_the_same_constrained_output(default_llm) -> None:
    structured = response_format_constraint(
        {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}, tokenizer=default_llm.tokenizer
    )
    prompts = [chat_prompt(default_llm, f"Describe person number {i}.") for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=40, structured=structured)
    expected = [o.outputs[0].token_ids for o in default_llm.generate(prompts, params)]
    per_token = 30 * 2 * 3 * 64 * 4  # SmolLM2-135M: layers, K and V, KV heads, head dim, fp32
    engine = LLMEngine(
        default_llm.loaded,
        default_llm.backend,
        EngineConfig(block_size=4, max_seq_len=128, kv_cache_memory_gib=160 * per_token / 2**30),
    )
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt["prompt"], prompt["prompt_token_ids"], params)
    finished = {}
    while engine.has_unfinished():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output.outputs[0].token_ids
    assert engine.scheduler.num_preemptions > 0
    assert [finished[str(i)] for i in range(4)] == expected
    assert not engine.guided.active


def test_bad_requests_are_refused_at_submission(default_llm) -> None:
    with pytest.raises(InvalidRequestError, match="outside"):
        default_llm.generate("hi", SamplingParams(thinking_budget=ThinkingBudget(3, (10**9,))))
    assert not default_llm.engine.guided.active
