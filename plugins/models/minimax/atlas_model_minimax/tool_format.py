"""``minimax_m2``: MiniMax-M2's tool-call format, XML elements whose parameter values are raw text
converted by each parameter's schema type (see `atlas_core.parsing.tools.xml_formats`)."""

from __future__ import annotations

import re

from atlas_core.parsing.tools.base import Literal
from atlas_core.parsing.tools.xml_formats import XmlParameterFormat


class MiniMaxM2Format(XmlParameterFormat):
    """``<minimax:tool_call>\\n<invoke name="NAME">\\n<parameter name="P">value</parameter>\\n</invoke>\\n``
    ``</minimax:tool_call>``, several ``<invoke>`` elements per region for parallel calls."""

    name = "minimax_m2"
    starts = ("<minimax:tool_call>",)
    end = "</minimax:tool_call>"
    call_pattern = re.compile(r"<invoke\s+name=\"([^\"]+)\"\s*>(.*?)</invoke>", re.S)
    parameter_pattern = re.compile(r"<parameter\s+name=\"([^\"]+)\"\s*>(.*?)</parameter>", re.S)
    unescape_names = True
    call_element = "<invoke name={name!r}>"
    parameter_element = "<parameter>"
    region_error = 'a <minimax:tool_call> must hold <invoke name="...">...</invoke> elements and nothing else'
    function_open = '<invoke name="{name}">\n'
    function_close = "</invoke>\n"
    parameter_open = '<parameter name="{name}">'
    parameter_close = "</parameter>\n"

    def _region_rules(self, functions: list[str], lit: Literal, parallel: bool) -> list[str]:
        repeat = "+" if parallel else ""
        return [
            f'calls: {lit("<minimax:tool_call>")} "\\n" invoke{repeat} {lit("</minimax:tool_call>")}',
            f"invoke: {' | '.join(functions)}",
        ]
