"""``deepseek_v3``: DeepSeek-V3's tool-call format (and V3.1's, without the type and code fence)::

<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
```json
{"arg": 1}
```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from atlas_core.parsing.tools.base import Literal, MarkupError, RawCall, ToolFormat, decode_json
from atlas_core.parsing.tools.grammar import json_rule, parameters, quoted
from atlas_core.parsing.types import ToolDefinition

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_CALL = re.compile(re.escape(CALL_BEGIN) + "(.*?)" + re.escape(CALL_END), re.S)
_FENCED = re.compile(r"\s*([^\n]+?)\s*\n\s*```(?:json)?\s*\n?(.*?)\n?\s*```\s*$", re.S)


class DeepSeekV3Format(ToolFormat):
    name = "deepseek_v3"
    starts = (CALLS_BEGIN,)
    end = CALLS_END

    @property
    def markers(self) -> tuple[str, ...]:
        return (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)

    def parse(self, start: str, body: str) -> list[RawCall]:
        calls = []
        for match in _CALL.finditer(body):
            head, sep, tail = match.group(1).partition(SEP)
            if not sep:
                raise MarkupError(f"a DeepSeek tool call lacks {SEP}")
            fenced = _FENCED.match(tail)
            if head.strip() == "function" and fenced:  # V3: type, then name and a ```json fence
                name, arguments = fenced.group(1), decode_json(fenced.group(2), "the DeepSeek call arguments")
            else:  # V3.1: name, then the JSON arguments
                name, arguments = head.strip(), decode_json(tail, "the DeepSeek call arguments")
            calls.append(RawCall(name.strip(), arguments, CALLS_BEGIN + match.group(0) + CALLS_END))
        if not calls or _CALL.sub("", body).strip():
            raise MarkupError(f"{CALLS_BEGIN} must hold {CALL_BEGIN}...{CALL_END} calls and nothing else")
        return calls

    def grammar(self, tools: Sequence[ToolDefinition], lit: Literal, parallel: bool) -> str:
        rules, alternatives = [], []
        for i, tool in enumerate(tools):
            alternatives.append(f"f{i}")
            rules.append(
                f'f{i}: {quoted(tool.name + chr(10) + "```json" + chr(10))} {json_rule(parameters(tool))} "\\n```"'
            )
        repeat = "+" if parallel else ""
        return (
            "\n".join(
                [
                    f"calls: {lit(CALLS_BEGIN)} call{repeat} {lit(CALLS_END)}",
                    f'call: {lit(CALL_BEGIN)} "function" {lit(SEP)} ({" | ".join(alternatives)}) {lit(CALL_END)}',
                    *rules,
                ]
            )
            + "\n"
        )
