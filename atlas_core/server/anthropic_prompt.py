"""An Anthropic Messages request -> `ChatSetup` (template messages, tools, tool choice, thinking)."""

from __future__ import annotations

from typing import Any

from atlas_core.parsing.types import ToolDefinition
from atlas_core.server.chat_prompt import ChatSetup, ToolChoice, check_tool_choice, template_kwargs
from atlas_core.server.errors import invalid
from atlas_core.server.media import ImageRef, anthropic_image
from atlas_core.server.schemas_anthropic import (
    CountTokensRequest,
    DocumentBlock,
    ImageBlock,
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ThinkingDisabled,
    ToolChoiceAny,
    ToolChoiceAuto,
    ToolChoiceNone,
    ToolChoiceTool,
    ToolResultBlock,
    ToolUseBlock,
)
from atlas_core.server.state import ServerState


def anthropic_setup(state: ServerState, request: CountTokensRequest) -> ChatSetup:
    """`ChatSetup` of a ``/v1/messages`` (or ``count_tokens``) request."""
    messages: list[dict[str, Any]] = []
    if request.system:
        system = request.system if isinstance(request.system, str) else "\n".join(b.text for b in request.system)
        messages.append({"role": "system", "content": system})
    images: list[ImageRef] = []
    for i, message in enumerate(request.messages):
        messages.extend(_convert(message, i, images))
    tools = []
    for i, tool in enumerate(request.tools or []):
        if tool.type not in (None, "custom"):
            raise invalid(
                f"tool {tool.name!r} has type {tool.type!r}: server tools are not supported", param=f"tools[{i}]"
            )
        tools.append(
            ToolDefinition(tool.name, tool.description, tool.input_schema or {"type": "object", "properties": {}})
        )
    choice, parallel = _tool_choice(request, bool(tools))
    check_tool_choice(tools, choice)
    thinking = request.thinking
    enable_thinking = None if thinking is None else not isinstance(thinking, ThinkingDisabled)
    return ChatSetup(
        messages=messages,
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=parallel,
        template_kwargs=template_kwargs(state, None, enable_thinking=enable_thinking),
        special_tokens_in_content=state.config.enable_special_tokens_in_content,
        images=images,
        media=state.config.media,
    )


def _tool_choice(request: CountTokensRequest, has_tools: bool) -> tuple[ToolChoice, bool]:
    choice = request.tool_choice
    if choice is None:
        return ("auto" if has_tools else "none"), True
    if isinstance(choice, ToolChoiceNone):
        return "none", True
    parallel = not choice.disable_parallel_tool_use
    if isinstance(choice, ToolChoiceAuto):
        return "auto", parallel
    if isinstance(choice, ToolChoiceAny):
        return "required", parallel
    assert isinstance(choice, ToolChoiceTool)
    return {"name": choice.name}, parallel


def _convert(message: Message, index: int, images: list[ImageRef]) -> list[dict[str, Any]]:
    """One Anthropic message -> template messages (tool results become ``tool`` messages first); its
    ``image`` blocks are appended to ``images`` and written as ``{"type": "image"}`` content items."""
    where = f"messages[{index}].content"
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    if message.role == "user" and any(isinstance(block, ImageBlock) for block in message.content):
        return [{"role": "user", "content": _with_images(message.content, index, images)}]
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ImageBlock):
            raise invalid("image blocks belong in user messages", param=where)
        elif isinstance(block, DocumentBlock):
            raise invalid("document content is not supported: the served model reads text and images only", param=where)
        elif isinstance(block, ThinkingBlock):
            reasoning.append(block.thinking)
        elif isinstance(block, RedactedThinkingBlock):
            continue
        elif isinstance(block, ToolUseBlock):
            if message.role != "assistant":
                raise invalid("tool_use blocks belong in assistant messages", param=where)
            calls.append(
                {"id": block.id, "type": "function", "function": {"name": block.name, "arguments": block.input}}
            )
        elif isinstance(block, ToolResultBlock):
            if message.role != "user":
                raise invalid("tool_result blocks belong in user messages", param=where)
            results.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": _result_text(block, where)})
    out = list(results)
    if message.role == "assistant":
        turn: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
        if reasoning:
            turn["reasoning_content"] = "\n".join(reasoning)
        if calls:
            turn["tool_calls"] = calls
        out.append(turn)
    elif texts or not results:
        out.append({"role": message.role, "content": "\n".join(texts)})
    return out


def _with_images(blocks: list[Any], index: int, images: list[ImageRef]) -> list[dict[str, str]]:
    """A user message's blocks, some of them images -> list content of text and image items (text and
    image blocks only)."""
    content: list[dict[str, str]] = []
    for k, block in enumerate(blocks):
        part = f"messages[{index}].content[{k}]"
        if isinstance(block, ImageBlock):
            images.append(anthropic_image(part, block.source))
            content.append({"type": "image"})
        elif isinstance(block, TextBlock):
            content.append({"type": "text", "text": block.text})
        else:
            raise invalid(f"{part}: a message with images may hold text and image blocks only", param=part)
    return content


def _result_text(block: ToolResultBlock, where: str) -> str:
    content = block.content
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        texts = [part.text for part in content if isinstance(part, TextBlock)]
        if len(texts) < len(content):
            raise invalid("tool results may hold text only: the served model reads text only", param=where)
        text = "\n".join(texts)
    return f"Error: {text}" if block.is_error else text
