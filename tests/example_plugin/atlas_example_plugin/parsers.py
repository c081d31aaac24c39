"""``example_calls`` and ``example_thoughts``: a tool-call format and a reasoning format of its own.

A model that calls tools as ``<|call|>get_weather{"city": "Paris"}<|end|>`` and thinks between
``<|thinking|>`` and ``<|/thinking|>`` is served with ``--tool-call-parser example_calls
--reasoning-parser example_thoughts`` (or a family's ``defaults`` naming them).
"""

from __future__ import annotations

from collections.abc import Sequence

from atlas_core.parsing import ToolDefinition
from atlas_core.parsing.reasoning import ReasoningFormat
from atlas_core.parsing.tools.base import Literal, MarkupError, RawCall, ToolFormat, decode_json
from atlas_core.parsing.tools.grammar import json_rule, parameters, quoted


class ExampleCallFormat(ToolFormat):
    """``<|call|>NAME{"key": value, ...}<|end|>``: one region per call, the arguments a JSON object
    right after the tool's name; parallel calls follow each other."""

    name = "example_calls"
    starts = ("<|call|>",)
    end = "<|end|>"

    def parse(self, start: str, body: str) -> list[RawCall]:
        name, brace, rest = body.partition("{")
        if not brace or not name.strip():
            raise MarkupError("a <|call|> must hold NAME{arguments}")
        arguments = decode_json(brace + rest, f"the arguments of {name.strip()!r}")
        return [RawCall(name.strip(), arguments, start + body + self.end)]

    def grammar(self, tools: Sequence[ToolDefinition], lit: Literal, parallel: bool) -> str:
        functions = " | ".join(f"{quoted(tool.name)} {json_rule(parameters(tool))}" for tool in tools)
        repeat = "+" if parallel else ""
        return f"calls: call{repeat}\ncall: {lit('<|call|>')} ({functions}) {lit('<|end|>')}\n"


EXAMPLE_THOUGHTS = ReasoningFormat("example_thoughts", "<|thinking|>", "<|/thinking|>")
