"""Which generation constraints a chat request turns into (`constraint_fields`), and that a forced tool
call passes through the engine's grammar when the model writes a valid one."""

from __future__ import annotations

import pytest

from atlas_core.parsing import ToolDefinition
from atlas_core.server.chat_prompt import ChatSetup
from atlas_core.server.constraints import constraint_fields
from atlas_core.server.errors import APIError
from atlas_core.server.output_parsing import ParserSpec
from atlas_core.server.schemas_openai import JSONObjectFormat, JSONSchemaFormat, JSONSchemaSpec, TextFormat
from atlas_core.server.state import ServerConfig, ServerState
from atlas_core.tokenizer import Tokenizer
from tests.server.conftest import ScriptedFactory

TOOLS = [
    ToolDefinition(
        "get_time",
        "Time in a zone",
        {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
    )
]


def spec(tool_choice: object = "auto", reasoning: str | None = None, tools: list[ToolDefinition] = TOOLS) -> ParserSpec:
    state = ServerState(ServerConfig(model_names=["m"], tool_call_parser="hermes", reasoning_parser=reasoning))
    setup = ChatSetup(messages=[{"role": "user", "content": "hi"}], tools=tools, tool_choice=tool_choice)  # type: ignore[arg-type]
    return ParserSpec(state, setup, "<|im_start|>assistant\n")


def test_auto_and_none_add_no_grammar(chatml_tokenizer: Tokenizer) -> None:
    assert "structured" not in constraint_fields(spec("auto"), chatml_tokenizer)
    assert "structured" not in constraint_fields(spec("none"), chatml_tokenizer, response_format=TextFormat())


def test_required_and_named_tool_choice_force_the_markup(chatml_tokenizer: Tokenizer) -> None:
    required = constraint_fields(spec("required"), chatml_tokenizer)["structured"]
    named = constraint_fields(spec({"name": "get_time"}), chatml_tokenizer)["structured"]
    assert required.kind == named.kind == "tool_call"
    assert "<tool_call>" in named.grammar and "get_time" in named.grammar


def test_response_formats(chatml_tokenizer: Tokenizer) -> None:
    assert (
        constraint_fields(spec(), chatml_tokenizer, response_format=JSONObjectFormat())["structured"].kind
        == "json_object"
    )
    schema = JSONSchemaFormat(JSONSchemaSpec(schema={"type": "object", "properties": {"a": {"type": "integer"}}}))
    assert constraint_fields(spec(), chatml_tokenizer, response_format=schema)["structured"].kind == "json_schema"
    with pytest.raises(APIError, match="cannot be combined"):
        constraint_fields(spec("required"), chatml_tokenizer, response_format=JSONObjectFormat())


def test_thinking_budget_needs_a_reasoning_parser(chatml_tokenizer: Tokenizer) -> None:
    budget = constraint_fields(spec(reasoning="qwen3"), chatml_tokenizer, thinking_tokens=64)["thinking_budget"]
    assert budget.max_tokens == 64
    assert chatml_tokenizer.decode(list(budget.end_token_ids)) == "\n</think>\n\n"
    assert "thinking_budget" not in constraint_fields(spec(), chatml_tokenizer, thinking_tokens=64)


def test_named_tool_choice_end_to_end(scripted: ScriptedFactory) -> None:
    call = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    server = scripted({"[ask]": call}, tool_call_parser="hermes")
    sdk = server.openai("x")
    tools = [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in TOOLS
    ]
    response = sdk.chat.completions.create(
        model="scripted",
        messages=[{"role": "user", "content": "[ask]"}],
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        temperature=0,
    )
    calls = response.choices[0].message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in calls] == [("get_time", '{"zone": "UTC"}')]
