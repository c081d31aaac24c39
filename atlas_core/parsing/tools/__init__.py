"""Tool-call formats by parser name (see `ToolFormat`)."""

from __future__ import annotations

from atlas_core.parsing.tools.base import MarkupError, RawCall, ToolFormat
from atlas_core.parsing.tools.deepseek import DeepSeekV3Format
from atlas_core.parsing.tools.gemma4 import Gemma4Format
from atlas_core.parsing.tools.json_formats import HermesFormat, JsonFormat, MistralFormat, NemotronFormat
from atlas_core.parsing.tools.xml_formats import MiniMaxM2Format, Qwen3CoderFormat

TOOL_FORMATS: dict[str, ToolFormat] = {
    fmt.name: fmt
    for fmt in (
        HermesFormat(),
        Qwen3CoderFormat(),
        MistralFormat(),
        JsonFormat(),
        DeepSeekV3Format(),
        MiniMaxM2Format(),
        NemotronFormat(),
        Gemma4Format(),
    )
}

__all__ = ["TOOL_FORMATS", "MarkupError", "RawCall", "ToolFormat"]
