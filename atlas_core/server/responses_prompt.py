"""A Responses API request -> `ChatSetup`: ``input`` items as chat-template messages, after the
stored conversation of ``previous_response_id`` and behind ``instructions``; function tools,
``tool_choice`` and ``text.format`` in the shapes the chat completion path takes.

Input items: messages (``type`` ``message`` or left out; roles ``user``, ``system``,
``developer`` (as system) and ``assistant``; content a string or ``input_text`` /
``output_text`` / ``refusal`` parts), ``function_call`` (an earlier call of the assistant),
``function_call_output`` (its result, a ``tool`` message) and ``reasoning`` (earlier thinking,
given to the next assistant turn). Consecutive reasoning, assistant message and function-call
items form one assistant turn, as models write them. Anything else is a 400 naming ``input[i]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from atlas_core.parsing.types import ToolDefinition
from atlas_core.server.chat_prompt import (
    REASONING_EFFORT_THINKS,
    ChatSetup,
    ToolChoice,
    check_tool_choice,
    template_kwargs,
)
from atlas_core.server.errors import invalid
from atlas_core.server.schemas_openai import (
    JSONObjectFormat,
    JSONSchemaFormat,
    JSONSchemaSpec,
    ResponseFormat,
    TextFormat,
)
from atlas_core.server.schemas_responses import (
    FunctionToolChoice,
    FunctionToolOut,
    ResponsesRequest,
    TextFormatJSONObject,
    TextFormatJSONSchema,
)
from atlas_core.server.state import ServerState

ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


@dataclass
class ResponsesSetup:
    """``setup`` renders the prompt; ``conversation`` is the same messages without the
    instructions (what a stored response keeps); ``tools`` are echoed in the response."""

    setup: ChatSetup
    conversation: list[dict[str, Any]]
    tools: list[FunctionToolOut]
    response_format: ResponseFormat | None


def responses_setup(state: ServerState, request: ResponsesRequest, history: list[dict[str, Any]]) -> ResponsesSetup:
    """The prompt of ``request``, continuing ``history`` (the stored conversation, or empty)."""
    conversation = [*history, *input_messages(request.input)]
    if not any(m["role"] != "system" for m in conversation):
        raise invalid("input must hold at least one message or item to answer", param="input")
    messages = list(conversation)
    if request.instructions:
        messages.insert(0, {"role": "system", "content": request.instructions})
    tools = _tools(request)
    definitions = [ToolDefinition(t.name, t.description, t.parameters) for t in tools]
    choice: ToolChoice
    if isinstance(request.tool_choice, FunctionToolChoice):
        choice = {"name": request.tool_choice.name}
    else:
        choice = request.tool_choice or ("auto" if tools else "none")
    check_tool_choice(definitions, choice)
    effort = request.reasoning.effort if request.reasoning else None
    thinks = REASONING_EFFORT_THINKS.get(effort, True) if effort else None
    setup = ChatSetup(
        messages=messages,
        tools=definitions,
        tool_choice=choice,
        parallel_tool_calls=request.parallel_tool_calls,
        template_kwargs=template_kwargs(state, request.chat_template_kwargs, enable_thinking=thinks),
        special_tokens_in_content=state.config.enable_special_tokens_in_content,
    )
    return ResponsesSetup(setup, conversation, tools, _response_format(request))


def _tools(request: ResponsesRequest) -> list[FunctionToolOut]:
    out = []
    for i, tool in enumerate(request.tools or []):
        if tool.type != "function":
            raise invalid(
                f"tools[{i}] has type {tool.type!r}: only function tools are supported (no hosted tools)",
                param=f"tools[{i}].type",
            )
        if not tool.name:
            raise invalid(f"tools[{i}] needs a name", param=f"tools[{i}].name")
        parameters = tool.parameters or {"type": "object", "properties": {}}
        out.append(
            FunctionToolOut(name=tool.name, parameters=parameters, description=tool.description, strict=tool.strict)
        )
    return out


def _response_format(request: ResponsesRequest) -> ResponseFormat | None:
    """``text.format`` as the chat completion ``response_format`` (enforced by the same grammar)."""
    fmt = request.text.format if request.text else None
    if isinstance(fmt, TextFormatJSONSchema):
        spec = JSONSchemaSpec(name=fmt.name, schema=fmt.schema, description=fmt.description, strict=fmt.strict)
        return JSONSchemaFormat(spec)
    if isinstance(fmt, TextFormatJSONObject):
        return JSONObjectFormat()
    return TextFormat() if fmt is not None else None


def input_messages(items: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """``input`` as chat-template messages (see the module docstring); 400 naming the bad item."""
    if items is None:
        return []
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    turn: dict[str, Any] | None = None  # the assistant turn being gathered

    def flush() -> None:  # a turn of nothing (say, only encrypted reasoning) is left out
        nonlocal turn
        if turn is not None and (turn["content"] or len(turn) > 2):
            out.append(turn)
        turn = None

    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = ROLES.get(str(item.get("role")))
            if role is None:
                raise invalid(
                    f"{where}.role must be one of {sorted(ROLES)}, got {item.get('role')!r}", param=f"{where}.role"
                )
            text = _text(item.get("content"), f"{where}.content")
            if role == "assistant":
                if turn is not None and (turn["content"] or "tool_calls" in turn):
                    flush()
                turn = turn or {"role": "assistant", "content": ""}
                turn["content"] = text
            else:
                flush()
                out.append({"role": role, "content": text})
        elif kind == "function_call":
            call_id, name = _string(item, "call_id", where), _string(item, "name", where)
            arguments = item.get("arguments", "")
            if not isinstance(arguments, str):
                raise invalid(f"{where}.arguments must be a JSON text (a string)", param=f"{where}.arguments")
            turn = turn or {"role": "assistant", "content": ""}
            turn.setdefault("tool_calls", []).append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            )
        elif kind == "function_call_output":
            flush()
            call_id = _string(item, "call_id", where)
            out.append(
                {"role": "tool", "tool_call_id": call_id, "content": _text(item.get("output"), f"{where}.output")}
            )
        elif kind == "reasoning":
            if turn is not None and (turn["content"] or "tool_calls" in turn):
                flush()
            thought = _reasoning_text(item, where)
            turn = turn or {"role": "assistant", "content": ""}
            if thought:
                turn["reasoning_content"] = turn.get("reasoning_content", "") + thought
        else:
            raise invalid(
                f"{where} has type {kind!r}; supported input items are message, function_call, "
                "function_call_output and reasoning",
                param=f"{where}.type",
            )
    flush()
    return out


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise invalid(f"{where}.{key} must be a non-empty string", param=f"{where}.{key}")
    return value


def _text(content: Any, where: str) -> str:
    """Message content (or a function call's output): a string or a list of text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"{where} must be a string or a list of input_text parts", param=where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS:
            raise invalid(
                f"{where}[{j}] has type {kind!r}: only text parts (input_text, output_text) are supported, the "
                "served model reads text only",
                param=f"{where}[{j}]",
            )
        text = part.get("refusal" if kind == "refusal" else "text")
        if not isinstance(text, str):
            raise invalid(f"{where}[{j}] needs its text as a string", param=f"{where}[{j}]")
        texts.append(text)
    return "\n".join(texts)


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    """The text of a reasoning item: its ``content`` if sent, else its summary (encrypted content,
    which only its issuer can read, is ignored)."""
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list) and parts:
            texts = [p.get("text") for p in parts if isinstance(p, dict)]
            if not all(isinstance(t, str) for t in texts):
                raise invalid(f"{where}.{key} parts need their text as a string", param=f"{where}.{key}")
            return "\n".join(t for t in texts if isinstance(t, str))
    return ""
