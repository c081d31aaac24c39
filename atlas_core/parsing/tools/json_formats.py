"""Tool-call formats whose calls are JSON objects ``{"name": ..., "arguments": {...}}``:
``hermes`` (Qwen2.5/Qwen3, NousResearch Hermes), ``nemotron``, ``mistral`` and the ``json`` fallback."""

from __future__ import annotations

import re
from collections.abc import Sequence

from atlas_core.parsing.tools.base import (
    Literal,
    MarkupError,
    RawCall,
    ToolFormat,
    calls_from_json,
    decode_json,
    decode_json_prefix,
    is_call_object,
    json_calls,
)
from atlas_core.parsing.tools.grammar import call_list_schema, call_object_schema, json_rule
from atlas_core.parsing.types import ToolDefinition


class HermesFormat(ToolFormat):
    """``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>``, one region per call."""

    name = "hermes"
    starts = ("<tool_call>",)
    end = "</tool_call>"

    def parse(self, start: str, body: str) -> list[RawCall]:
        return json_calls(body, "the <tool_call> body")

    def grammar(self, tools: Sequence[ToolDefinition], lit: Literal, parallel: bool) -> str:
        more = ' ("\\n" call)*' if parallel else ""
        return (
            f"calls: call{more}\n"
            f'call: {lit("<tool_call>")} "\\n" {json_rule(call_object_schema(tools))} "\\n" {lit("</tool_call>")}\n'
        )


class NemotronFormat(ToolFormat):
    """``<TOOLCALL>[{"name": "f", "arguments": {...}}, ...]</TOOLCALL>``."""

    name = "nemotron"
    starts = ("<TOOLCALL>",)
    end = "</TOOLCALL>"

    def parse(self, start: str, body: str) -> list[RawCall]:
        return json_calls(body, "the <TOOLCALL> body")

    def grammar(self, tools: Sequence[ToolDefinition], lit: Literal, parallel: bool) -> str:
        return f"calls: {lit('<TOOLCALL>')} {json_rule(call_list_schema(tools, parallel))} {lit('</TOOLCALL>')}\n"


_MISTRAL_NAMED = re.compile(r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[CALL_ID\]\s*[A-Za-z0-9]+\s*)?\[ARGS\]", re.S)


class MistralFormat(ToolFormat):
    """``[TOOL_CALLS]`` followed by a JSON list of calls (older tokenizers) or by ``name[ARGS]{json}``
    (repeated, each after its own ``[TOOL_CALLS]``, in newer ones). The region runs to the end of
    the output. ``[TOOL_CALLS]`` is a special token: the server keeps special tokens in the text."""

    name = "mistral"
    starts = ("[TOOL_CALLS]",)
    end = None

    def parse(self, start: str, body: str) -> list[RawCall]:
        calls: list[RawCall] = []
        for chunk in body.split("[TOOL_CALLS]"):
            if not chunk.strip():
                continue
            named = _MISTRAL_NAMED.match(chunk)
            if named:
                arguments, rest = decode_json_prefix(chunk[named.end() :], f"the [ARGS] of {named.group(1)!r}")
                if rest.strip():
                    raise MarkupError(f"text after the arguments of {named.group(1)!r}: {rest.strip()[:40]!r}")
                calls.append(RawCall(named.group(1), arguments, start + chunk.strip()))
            else:
                calls.extend(json_calls(chunk, "the [TOOL_CALLS] list"))
        if not calls:
            raise MarkupError("[TOOL_CALLS] is followed by no call")
        return calls

    def grammar(self, tools: Sequence[ToolDefinition], lit: Literal, parallel: bool) -> str:
        return f"calls: {lit('[TOOL_CALLS]')} {json_rule(call_list_schema(tools, parallel))}\n"


_FENCE = re.compile(r"\s*```[A-Za-z]*\s*\n?(.*?)\n?\s*```\s*$", re.S)


class JsonFormat(ToolFormat):
    """The whole content is a JSON call object or list of them, possibly inside a ```json fence.
    JSON that does not have the call shape is ordinary content."""

    name = "json"
    starts = ("```json", "```", "{", "[")
    end = None
    anchored = True

    def parse(self, start: str, body: str) -> list[RawCall] | None:
        text = start + body
        fenced = _FENCE.match(text)
        if text.startswith("```"):
            if not fenced:
                return None
            text = fenced.group(1)
        try:
            value = decode_json(text, "the output")
        except MarkupError:
            return None
        return calls_from_json(value, "the output") if is_call_object(value) else None

    def grammar(self, tools: Sequence[ToolDefinition], lit: Literal, parallel: bool) -> str:
        return f"calls: {json_rule(call_list_schema(tools, parallel))}\n"
