"""A chat request -> the prompt the model sees, through the model's own chat template.

Both APIs convert their messages into the Hugging Face template shape (``role``/``content``,
``tool_calls`` with ``function.arguments``, ``tool`` messages with ``tool_call_id``,
``reasoning_content`` for earlier thinking) and pass tools in OpenAI's function format, which is
what published templates expect. `ChatSetup` carries what the output parser needs as well.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

from atlas_core.errors import InvalidRequestError
from atlas_core.model.vision import PreparedImage, expand_placeholders
from atlas_core.parsing.types import ToolDefinition
from atlas_core.server.errors import invalid
from atlas_core.server.media import ImageRef, MediaPolicy, openai_image, prepare_images
from atlas_core.server.sampling import check_prompt_length, check_text_chars
from atlas_core.server.schemas_openai import ChatCompletionRequest, ChatMessage, ImagePart, NamedToolChoice
from atlas_core.server.state import ModelRuntime, ServerState
from atlas_core.tokenizer.chat_encoding import EncodedChat, encode_chat

ToolChoice = str | dict[str, str]
"""``"auto"``, ``"none"``, ``"required"`` or ``{"name": tool}``."""


@dataclass
class ChatSetup:
    """A conversation ready to render: template messages, tools, tool choice and template kwargs."""

    messages: list[dict[str, Any]]
    tools: list[ToolDefinition] = field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    special_tokens_in_content: bool = False
    images: list[ImageRef] = field(default_factory=list)
    """The messages' images in order; a message with images has list content, ``{"type": "image"}``
    items where they stand (the chat template writes each one's placeholder)."""
    media: MediaPolicy = field(default_factory=MediaPolicy)

    def template_tools(self) -> list[dict[str, Any]] | None:
        if not self.tools:
            return None
        return [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description or "", "parameters": t.parameters},
            }
            for t in self.tools
        ]


@dataclass
class ChatPrompt(EncodedChat):
    """A rendered chat and its images, prepared for the model (their placeholders already expanded in ``ids``)."""

    images: list[PreparedImage] = field(default_factory=list)


def render(runtime: ModelRuntime, setup: ChatSetup, *, check_length: bool = True) -> ChatPrompt:
    """Render and tokenize (`encode_chat`: special-token strings in the content are plain text
    unless ``setup.special_tokens_in_content``; with images, the rendered text rewritten as the model's
    processor does, `VisionModel.rewrite_template_text`), then read and prepare the images and expand their
    placeholders (`atlas_core.server.media`); 400 when there are no messages, the template rejects
    them, an image cannot be used, or (``check_length``) the prompt leaves no room to answer.
    Blocking work: routes run it in a worker thread."""
    if not setup.messages:
        raise invalid("messages must not be empty", param="messages")
    if check_length:
        check_text_chars(runtime.tokenizer, sum(map(_text_chars, setup.messages)), runtime.max_seq_len - 1)
    vision = runtime.engine.engine.loaded.model.vision
    images = prepare_images(vision, setup.images, setup.media)  # first: a text-only model refuses images by name
    rewrite = None
    if vision is not None and setup.images:
        rewrite = partial(vision.rewrite_template_text, token=runtime.tokenizer.token_to_str)
    prompt = encode_chat(
        runtime.tokenizer,
        setup.messages,
        tools=setup.template_tools(),
        add_generation_prompt=setup.add_generation_prompt,
        continue_final_message=setup.continue_final_message,
        chat_template_kwargs=setup.template_kwargs,
        special_tokens_in_content=setup.special_tokens_in_content,
        rewrite=rewrite,
    )
    ids = prompt.ids
    if vision is not None and images:
        try:
            ids = expand_placeholders(prompt.ids, images, vision.image_token_id)[0]
        except InvalidRequestError as exc:
            raise invalid(f"the chat template's image placeholders do not match the images: {exc}") from exc
    if check_length:
        check_prompt_length(len(ids), runtime.max_seq_len)
    return ChatPrompt(prompt.text, ids, images)


def _text_chars(value: Any) -> int:
    """Characters of the text in a message (its strings, nested parts and tool calls included)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(map(_text_chars, value.values()))
    if isinstance(value, list):
        return sum(map(_text_chars, value))
    return 0


def check_tool_choice(tools: list[ToolDefinition], choice: ToolChoice) -> None:
    """400 when ``choice`` asks for a tool call that ``tools`` cannot satisfy."""
    if choice == "required" and not tools:
        raise invalid("tool_choice 'required' needs at least one tool in tools", param="tool_choice")
    if isinstance(choice, dict):
        names = [t.name for t in tools]
        if choice["name"] not in names:
            raise invalid(
                f"tool_choice names {choice['name']!r}, which is not among the tools {names}", param="tool_choice"
            )


def template_kwargs(state: ServerState, request_kwargs: dict[str, Any] | None, **overrides: Any) -> dict[str, Any]:
    """The server's default chat-template kwargs, then the request's, then ``overrides`` (non-None)."""
    merged = {**state.config.default_chat_template_kwargs, **(request_kwargs or {})}
    merged.update({k: v for k, v in overrides.items() if v is not None})
    return merged


REASONING_EFFORT_THINKS = {"none": False, "minimal": False, "low": True, "medium": True, "high": True}
"""OpenAI ``reasoning_effort`` -> the templates' ``enable_thinking``."""


def openai_setup(state: ServerState, request: ChatCompletionRequest) -> ChatSetup:
    """`ChatSetup` of an OpenAI chat completion request."""
    tools = [
        ToolDefinition(
            t.function.name, t.function.description, t.function.parameters or {"type": "object", "properties": {}}
        )
        for t in request.tools or []
    ]
    choice: ToolChoice
    if isinstance(request.tool_choice, NamedToolChoice):
        choice = {"name": request.tool_choice.function.name}
    else:
        choice = request.tool_choice or ("auto" if tools else "none")
    check_tool_choice(tools, choice)
    thinks = REASONING_EFFORT_THINKS.get(request.reasoning_effort) if request.reasoning_effort else None
    images: list[ImageRef] = []
    return ChatSetup(
        messages=[_openai_message(m, i, images) for i, m in enumerate(request.messages)],
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=request.parallel_tool_calls,
        template_kwargs=template_kwargs(state, request.chat_template_kwargs, enable_thinking=thinks),
        add_generation_prompt=request.add_generation_prompt,
        continue_final_message=request.continue_final_message,
        special_tokens_in_content=state.config.enable_special_tokens_in_content,
        images=images,
        media=state.config.media,
    )


def _openai_message(message: ChatMessage, index: int, images: list[ImageRef]) -> dict[str, Any]:
    """One OpenAI message -> a template message; its ``image_url`` parts are appended to ``images``."""
    role = "system" if message.role == "developer" else message.role
    out: dict[str, Any] = {"role": role}
    content: str | list[dict[str, str]] | None
    if isinstance(message.content, list):
        parts = message.content
        if any(isinstance(part, ImagePart) for part in parts):
            content = []
            for k, part in enumerate(parts):
                if isinstance(part, ImagePart):
                    images.append(openai_image(f"messages[{index}].content[{k}]", part.image_url.url))
                    content.append({"type": "image"})
                else:
                    content.append({"type": "text", "text": part.text})
        else:
            content = "\n".join(part.text for part in parts if not isinstance(part, ImagePart))
    else:
        content = message.content
    out["content"] = content if content is not None else ""
    if message.name is not None:
        out["name"] = message.name
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.reasoning_content is not None:
        out["reasoning_content"] = message.reasoning_content
    if role == "tool" and message.tool_call_id is None:
        raise invalid("a tool message needs tool_call_id", param=f"messages[{index}].tool_call_id")
    return out
