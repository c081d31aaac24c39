"""Rendering a model's Jinja chat template, the way Hugging Face transformers does.

Chat templates ship inside model folders, so they are untrusted input: they run in
`jinja2.sandbox.ImmutableSandboxedEnvironment`, which refuses access to private attributes
(``''.__class__``) and to methods that mutate data (``messages.append``). The environment
otherwise matches transformers so published templates render identically: ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, a ``{% generation %}`` block tag, the
``raise_exception`` and ``strftime_now`` globals, and a ``tojson`` filter that keeps non-ASCII
characters and accepts ``indent``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from atlas_core.errors import InvalidRequestError


class _TemplateRaised(jinja2.TemplateError):
    """Raised by the template itself through ``raise_exception``; its message is for the user."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' ``tojson``: plain `json.dumps` (no HTML escaping), non-ASCII kept."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}`` marks assistant text for training masks;
    for inference it renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return caller()


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols", _GenerationTag],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _flatten_content(content: Any) -> Any:
    """A list made only of ``{"type": "text", "text": ...}`` parts becomes one string (parts
    joined with newlines); any other content is returned unchanged."""
    if not isinstance(content, list) or not content:
        return content
    for part in content:
        if not (isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)):
            return content
    return "\n".join(part["text"] for part in content)


def _decode_tool_arguments(tool_calls: Any) -> Any:
    """Tool-call ``arguments`` sent as a JSON object string (OpenAI's wire format) become dicts,
    which is what templates expect (they apply ``tojson`` themselves)."""
    if not isinstance(tool_calls, list):
        return tool_calls
    out = []
    for call in tool_calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping) and isinstance(arguments := function.get("arguments"), str):
            try:
                parsed = json.loads(arguments)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                call = {**call, "function": {**function, "arguments": parsed}}
        out.append(call)
    return out


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copies of `messages` as templates expect them: text-only content part lists flattened to
    strings and tool-call arguments decoded from JSON strings. The input is not modified."""
    out = []
    for message in messages:
        if not isinstance(message, Mapping):
            raise InvalidRequestError(f"each chat message must be an object, got {type(message).__name__}")
        copy = dict(message)
        if "content" in copy:
            copy["content"] = _flatten_content(copy["content"])
        if "tool_calls" in copy:
            copy["tool_calls"] = _decode_tool_arguments(copy["tool_calls"])
        out.append(copy)
    return out


class ChatTemplate:
    """A model's Jinja chat template rendered in jinja2.sandbox.ImmutableSandboxedEnvironment
    (templates are untrusted input): trim_blocks/lstrip_blocks like transformers,
    `raise_exception`, `strftime_now`, a `tojson` filter that matches transformers
    (ensure_ascii=False, supports indent), loopcontrols extension. Compiled once per instance.

    `origin` names where the template came from (a file path) in error messages.
    Raises `InvalidRequestError`, with the line number, when `source` is not valid Jinja.
    """

    def __init__(self, source: str, *, origin: str = "chat template") -> None:
        self.source = source
        self.origin = origin
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise InvalidRequestError(f"{origin}: Jinja syntax error at line {e.lineno}: {e.message}") from e

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        special_token_strings: Mapping[str, str] | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """Render the prompt text for `messages` (see `normalize_messages`).

        The template sees ``messages``, ``tools`` (None when not given, as in transformers),
        ``add_generation_prompt``, each entry of `special_token_strings` (``bos_token``, ...)
        and each of `variables` (chat_template_kwargs such as ``enable_thinking``); `variables` may
        override special tokens but never the named arguments (`RESERVED_KWARGS`: an
        `InvalidRequestError`). ``continue_final_message``: the text ends with the last message's
        content, left open for the model to continue (as transformers does; it cannot be combined
        with ``add_generation_prompt``).

        Raises `InvalidRequestError` when the template calls ``raise_exception`` (its message is
        forwarded), attempts an operation the sandbox forbids, or fails for any other reason.
        """
        variables = variables or {}
        reserved = sorted(RESERVED_KWARGS & variables.keys())
        if reserved:
            raise InvalidRequestError(
                f"chat_template_kwargs must not set {', '.join(reserved)}: the request's own field of that name "
                "does; send it there instead"
            )
        if continue_final_message and add_generation_prompt:
            raise InvalidRequestError(
                "continue_final_message and add_generation_prompt cannot both be true: to continue the last "
                "message, send add_generation_prompt false"
            )
        normalized = normalize_messages(messages)
        context: dict[str, Any] = {**(special_token_strings or {}), **variables}
        context.update(messages=normalized, tools=tools, add_generation_prompt=add_generation_prompt)
        try:
            text = self._template.render(context)
        except _TemplateRaised as e:
            raise InvalidRequestError(f"the chat template rejected the request: {e.message}") from e
        except jinja2.exceptions.SecurityError as e:
            raise InvalidRequestError(f"{self.origin}: the chat template attempted a forbidden operation: {e}") from e
        except Exception as e:  # a template can fail in arbitrary ways on unexpected input
            raise InvalidRequestError(
                f"{self.origin}: the chat template failed to render these messages: {type(e).__name__}: {e}"
            ) from e
        return _open_final_message(text, normalized) if continue_final_message else text


RESERVED_KWARGS = frozenset({"messages", "tools", "add_generation_prompt", "continue_final_message"})
"""Template variables that only `ChatTemplate.render`'s own arguments set."""


def _open_final_message(text: str, messages: list[dict[str, Any]]) -> str:
    """``text`` cut just after the last message's content (transformers' ``continue_final_message``):
    whatever the template closes the turn with is dropped. `InvalidRequestError` when the content
    cannot be found in ``text``."""
    final = messages[-1].get("content") if messages else None
    if not isinstance(final, str) or not final.strip():
        raise InvalidRequestError("continue_final_message needs a last message with text content to continue")
    at = text.rfind(final.strip())
    if at < 0:
        raise InvalidRequestError(
            "continue_final_message: the chat template does not render the last message's content as it is, so "
            "there is no place to continue from; leave continue_final_message out"
        )
    kept = final.lstrip() if text[at : at + len(final.lstrip())] == final.lstrip() else final.strip()
    return text[: at + len(kept)]


__all__ = ["RESERVED_KWARGS", "ChatTemplate", "normalize_messages"]
