"""Entry point of the ``atlas-model-qwen3-vl`` distribution (group ``atlas``)."""

from __future__ import annotations

from atlas_core.hookspecs import Register, hookimpl


@hookimpl
def register_model_loaders(register: Register) -> None:
    register(
        "qwen3_vl",
        "atlas_model_qwen3_vl.loader:Qwen3VLLoader",
        architectures=["Qwen3VLForConditionalGeneration"],
        defaults={"reasoning_parser": "qwen3", "tool_call_parser": "hermes"},
    )
    register(
        "qwen3_vl_moe",
        "atlas_model_qwen3_vl.loader:Qwen3VLMoeLoader",
        architectures=["Qwen3VLMoeForConditionalGeneration"],
        defaults={"reasoning_parser": "qwen3", "tool_call_parser": "hermes"},
    )


@hookimpl
def register_layers(register: Register) -> None:
    register("qwen3_vl_patch_merger", "atlas_model_qwen3_vl.layers:PatchMerger")
