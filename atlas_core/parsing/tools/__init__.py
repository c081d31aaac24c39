"""Tool-call formats: the `ToolFormat` contract and the formats core registers
(``atlas_core.builtin_plugin.CORE_TOOL_PARSERS``); names are looked up in `atlas_core.parsing.registry`."""

from __future__ import annotations

from atlas_core.parsing.tools.base import MarkupError, RawCall, ToolFormat

__all__ = ["MarkupError", "RawCall", "ToolFormat"]
