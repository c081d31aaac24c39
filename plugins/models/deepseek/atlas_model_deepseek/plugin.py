"""Entry point of the ``atlas-model-deepseek`` distribution (group ``atlas``).

Serving defaults: DeepSeek-V3 / R1 write their reasoning between ``<think>`` and ``</think>`` and
call tools with DeepSeek-V3's ``<｜tool▁calls▁begin｜>`` markup; Mistral Small 4 writes reasoning
between ``[THINK]`` and ``[/THINK]`` and calls tools with ``[TOOL_CALLS]``. This plugin registers
the ``deepseek_v3`` tool-call format (`atlas_model_deepseek.tool_format`); the others are core's.
"""

from __future__ import annotations

from atlas_core.hookspecs import Register, hookimpl

DEEPSEEK_DEFAULTS = {"reasoning_parser": "deepseek_r1", "tool_call_parser": "deepseek_v3"}
MISTRAL_DEFAULTS = {"reasoning_parser": "mistral", "tool_call_parser": "mistral"}


@hookimpl
def register_model_loaders(register: Register) -> None:
    register(
        "deepseek_v3",
        "atlas_model_deepseek.loader:DeepseekV3Loader",
        architectures=["DeepseekV3ForCausalLM"],
        defaults=DEEPSEEK_DEFAULTS,
    )
    register(
        "mistral4",
        "atlas_model_deepseek.loader:Mistral4Loader",
        architectures=["Mistral4ForCausalLM"],
        defaults=MISTRAL_DEFAULTS,
    )
    register(
        "mistral3",
        "atlas_model_deepseek.loader:Mistral3Loader",
        architectures=["Mistral3ForConditionalGeneration"],
        defaults=MISTRAL_DEFAULTS,
    )


@hookimpl
def register_tool_parsers(register: Register) -> None:
    register("deepseek_v3", "atlas_model_deepseek.tool_format:DeepSeekV3Format")
