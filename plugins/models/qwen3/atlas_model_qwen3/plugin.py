"""Entry point of the ``atlas-model-qwen3`` distribution (group ``atlas``)."""

from __future__ import annotations

from atlas_core.hookspecs import Register, hookimpl


@hookimpl
def register_model_loaders(register: Register) -> None:
    register(
        "qwen3",
        "atlas_model_qwen3.loader:Qwen3Loader",
        architectures=["Qwen3ForCausalLM"],
        defaults={"reasoning_parser": "qwen3", "tool_call_parser": "hermes"},
    )
