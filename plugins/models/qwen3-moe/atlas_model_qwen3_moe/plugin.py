"""Entry point of the ``atlas-model-qwen3-moe`` distribution (group ``atlas``)."""

from __future__ import annotations

from atlas_core.hookspecs import Register, hookimpl


@hookimpl
def register_model_loaders(register: Register) -> None:
    register(
        "qwen3_moe",
        "atlas_model_qwen3_moe.loader:Qwen3MoeLoader",
        architectures=["Qwen3MoeForCausalLM"],
        defaults={"reasoning_parser": "qwen3", "tool_call_parser": "hermes"},
    )
