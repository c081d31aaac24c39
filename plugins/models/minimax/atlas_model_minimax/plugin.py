"""Entry point of the ``atlas-model-minimax`` distribution (group ``atlas``)."""

from __future__ import annotations

from atlas_core.hookspecs import Register, hookimpl


@hookimpl
def register_model_loaders(register: Register) -> None:
    register(
        "minimax_m2",
        "atlas_model_minimax.loader:MiniMaxM2Loader",
        architectures=["MiniMaxM2ForCausalLM"],
        # MiniMax-M2 thinks inside <think>...</think> like Qwen3 and calls tools in <minimax:tool_call> XML
        defaults={"reasoning_parser": "qwen3", "tool_call_parser": "minimax_m2"},
    )


@hookimpl
def register_tool_parsers(register: Register) -> None:
    register("minimax_m2", "atlas_model_minimax.tool_format:MiniMaxM2Format")
