"""Tool-call formats with XML-style parameters whose values are raw text, converted by the
parameter's schema type: the `XmlParameterFormat` base and ``qwen3_coder`` (Qwen3-Coder,
Qwen3.5/3.6). Family plugins build their own on the base (``minimax_m2`` in atlas-model-minimax)."""

from __future__ import annotations

import html
import re
from abc import abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from atlas_core.parsing.tools.base import Literal, MarkupError, RawCall, ToolFormat
from atlas_core.parsing.tools.grammar import quoted, xml_parameter_rules
from atlas_core.parsing.types import ToolDefinition


def _strip_one_newline(value: str) -> str:
    """Values sit on their own lines (``>\\nvalue\\n<``); those two newlines are markup."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def _parameters(body: str, pattern: re.Pattern[str], owner: str) -> dict[str, str]:
    """The raw values of the parameter elements in ``body`` by name; `MarkupError` for a name given twice."""
    values: dict[str, str] = {}
    for match in pattern.finditer(body):
        name = html.unescape(match.group(1).strip())
        if name in values:
            raise MarkupError(f"parameter {name!r} of {owner!r} is given twice")
        values[name] = _strip_one_newline(match.group(2))
    return values


def _leftover(text: str, *patterns: re.Pattern[str]) -> str:
    """``text`` without the matches of ``patterns``, stripped: anything left is stray text."""
    for pattern in patterns:
        text = pattern.sub("", text)
    return text.strip()


class XmlParameterFormat(ToolFormat):
    """A region holds call elements (``call_pattern``: group 1 the function name, group 2 the
    body) whose bodies hold only parameter elements (``parameter_pattern``: group 1 the parameter
    name, group 2 the raw value). The templates take ``name``: ``call_element`` and
    ``parameter_element`` name the elements in error messages; ``function_open``/``function_close``
    and ``parameter_open``/``parameter_close`` are the exact markup the grammar generates."""

    call_pattern: ClassVar[re.Pattern[str]]
    parameter_pattern: ClassVar[re.Pattern[str]]
    unescape_names: ClassVar[bool]
    """Whether function names are HTML-unescaped (they sit in an attribute value)."""
    call_element: ClassVar[str]
    parameter_element: ClassVar[str]
    region_error: ClassVar[str]
    function_open: ClassVar[str]
    function_close: ClassVar[str]
    parameter_open: ClassVar[str]
    parameter_close: ClassVar[str]

    def parse(self, start: str, body: str) -> list[RawCall]:
        calls = []
        for match in self.call_pattern.finditer(body):
            name = match.group(1).strip()
            name = html.unescape(name) if self.unescape_names else name
            if _leftover(match.group(2), self.parameter_pattern):
                raise MarkupError(
                    f"the body of {self.call_element.format(name=name)} "
                    f"has text outside {self.parameter_element} elements"
                )
            arguments = _parameters(match.group(2), self.parameter_pattern, name)
            calls.append(RawCall(name, arguments, start + match.group(0) + (self.end or ""), text_values=True))
        if not calls or _leftover(body, self.call_pattern):
            raise MarkupError(self.region_error)
        return calls

    def grammar(self, tools: Sequence[ToolDefinition], lit: Literal, parallel: bool) -> str:
        rules, functions = [], []
        for i, tool in enumerate(tools):
            params, param_rules = xml_parameter_rules(f"t{i}", tool, self.parameter_open, self.parameter_close, lit)
            functions.append(f"f{i}")
            rules.append(
                f"f{i}: {quoted(self.function_open.format(name=tool.name))} {params} {quoted(self.function_close)}"
            )
            rules.extend(param_rules)
        return "\n".join([*self._region_rules(functions, lit, parallel), *rules]) + "\n"

    @abstractmethod
    def _region_rules(self, functions: list[str], lit: Literal, parallel: bool) -> list[str]:
        """The rules defining ``calls`` (one region, or several for ``parallel``) from the rule
        names ``functions`` of one call of each tool."""


class Qwen3CoderFormat(XmlParameterFormat):
    """``<tool_call>\\n<function=NAME>\\n<parameter=P>\\nvalue\\n</parameter>\\n</function>\\n</tool_call>``."""

    name = "qwen3_coder"
    starts = ("<tool_call>",)
    end = "</tool_call>"
    call_pattern = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)
    parameter_pattern = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)
    unescape_names = False
    call_element = "<function={name}>"
    parameter_element = "<parameter=...>"
    region_error = "a <tool_call> must hold <function=NAME>...</function> elements and nothing else"
    function_open = "<function={name}>\n"
    function_close = "</function>\n"
    parameter_open = "<parameter={name}>\n"
    parameter_close = "\n</parameter>\n"

    def _region_rules(self, functions: list[str], lit: Literal, parallel: bool) -> list[str]:
        more = ' ("\\n" call)*' if parallel else ""
        return [
            f"calls: call{more}",
            f'call: {lit("<tool_call>")} "\\n" ({" | ".join(functions)}) {lit("</tool_call>")}',
        ]
