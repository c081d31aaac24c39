"""Tool-call formats with XML-style parameters whose values are raw text, converted by the
parameter's schema type: ``qwen3_coder`` (Qwen3-Coder, Qwen3.5/3.6) and ``minimax_m2``."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

from atlas_core.parsing.tools.base import Literal, MarkupError, RawCall, ToolFormat
from atlas_core.parsing.tools.grammar import quoted, xml_parameter_rules
from atlas_core.parsing.types import ToolDefinition


def _strip_one_newline(value: str) -> str:
    """Values sit on their own lines (``>\\nvalue\\n<``); those two newlines are markup."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def _parameters(body: str, pattern: re.Pattern[str], owner: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for match in pattern.finditer(body):
        name = html.unescape(match.group(1).strip())
        if name in values:
            raise MarkupError(f"parameter {name!r} of {owner!r} is given twice")
        values[name] = _strip_one_newline(match.group(2))
    return values


def _leftover(text: str, *patterns: re.Pattern[str]) -> str:
    for pattern in patterns:
        text = pattern.sub("", text)
    return text.strip()


_QWEN_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)
_QWEN_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


class Qwen3CoderFormat(ToolFormat):
    """``<tool_call>\\n<function=NAME>\\n<parameter=P>\\nvalue\\n</parameter>\\n</function>\\n</tool_call>``."""

    name = "qwen3_coder"
    starts = ("<tool_call>",)
    end = "</tool_call>"

    def parse(self, start: str, body: str) -> list[RawCall]:
        calls = []
        for match in _QWEN_FUNCTION.finditer(body):
            name = match.group(1).strip()
            if _leftover(match.group(2), _QWEN_PARAMETER):
                raise MarkupError(f"the body of <function={name}> has text outside <parameter=...> elements")
            arguments = _parameters(match.group(2), _QWEN_PARAMETER, name)
            calls.append(RawCall(name, arguments, start + match.group(0) + (self.end or ""), text_values=True))
        if not calls or _leftover(body, _QWEN_FUNCTION):
            raise MarkupError("a <tool_call> must hold <function=NAME>...</function> elements and nothing else")
        return calls

    def grammar(self, tools: Sequence[ToolDefinition], lit: Literal, parallel: bool) -> str:
        rules, functions = [], []
        for i, tool in enumerate(tools):
            params, param_rules = xml_parameter_rules(f"t{i}", tool, "<parameter={name}>\n", "\n</parameter>\n", lit)
            functions.append(f"f{i}")
            rules.append(f'f{i}: {quoted(f"<function={tool.name}>" + chr(10))} {params} "</function>\\n"')
            rules.extend(param_rules)
        more = ' ("\\n" call)*' if parallel else ""
        return (
            "\n".join(
                [
                    f"calls: call{more}",
                    f'call: {lit("<tool_call>")} "\\n" ({" | ".join(functions)}) {lit("</tool_call>")}',
                    *rules,
                ]
            )
            + "\n"
        )


_MINIMAX_INVOKE = re.compile(r"<invoke\s+name=\"([^\"]+)\"\s*>(.*?)</invoke>", re.S)
_MINIMAX_PARAMETER = re.compile(r"<parameter\s+name=\"([^\"]+)\"\s*>(.*?)</parameter>", re.S)


class MiniMaxM2Format(ToolFormat):
    """``<minimax:tool_call>\\n<invoke name="NAME">\\n<parameter name="P">value</parameter>\\n</invoke>\\n``
    ``</minimax:tool_call>``, several ``<invoke>`` elements per region for parallel calls."""

    name = "minimax_m2"
    starts = ("<minimax:tool_call>",)
    end = "</minimax:tool_call>"

    def parse(self, start: str, body: str) -> list[RawCall]:
        calls = []
        for match in _MINIMAX_INVOKE.finditer(body):
            name = html.unescape(match.group(1).strip())
            if _leftover(match.group(2), _MINIMAX_PARAMETER):
                raise MarkupError(f"the body of <invoke name={name!r}> has text outside <parameter> elements")
            arguments = _parameters(match.group(2), _MINIMAX_PARAMETER, name)
            calls.append(RawCall(name, arguments, start + match.group(0) + (self.end or ""), text_values=True))
        if not calls or _leftover(body, _MINIMAX_INVOKE):
            raise MarkupError(
                'a <minimax:tool_call> must hold <invoke name="...">...</invoke> elements and nothing else'
            )
        return calls

    def grammar(self, tools: Sequence[ToolDefinition], lit: Literal, parallel: bool) -> str:
        rules, invokes = [], []
        for i, tool in enumerate(tools):
            params, param_rules = xml_parameter_rules(f"t{i}", tool, '<parameter name="{name}">', "</parameter>\n", lit)
            invokes.append(f"f{i}")
            rules.append(
                f'f{i}: {quoted(f"<invoke name={chr(34)}{tool.name}{chr(34)}>" + chr(10))} {params} "</invoke>\\n"'
            )
            rules.extend(param_rules)
        repeat = "+" if parallel else ""
        return (
            "\n".join(
                [
                    f'calls: {lit("<minimax:tool_call>")} "\\n" invoke{repeat} {lit("</minimax:tool_call>")}',
                    f"invoke: {' | '.join(invokes)}",
                    *rules,
                ]
            )
            + "\n"
        )
