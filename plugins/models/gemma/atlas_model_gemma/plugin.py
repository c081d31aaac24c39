"""Entry point of the ``atlas-model-gemma`` distribution (group ``atlas``).

Serving defaults: Gemma 3 has no reasoning mode and no tool-call tokens (tools are prompted and
answered as JSON: the generic ``json`` parser); Gemma 4 thinks inside ``<|channel>thought ...<channel|>``
and calls tools as ``<|tool_call>call:name{...}<tool_call|>``: parsers named ``gemma4``, which this
plugin registers (`atlas_model_gemma.reasoning`, `atlas_model_gemma.tool_format`).
"""

from __future__ import annotations

from atlas_core.hookspecs import Register, hookimpl

GEMMA3_DEFAULTS = {"reasoning_parser": None, "tool_call_parser": "json"}
GEMMA4_DEFAULTS = {"reasoning_parser": "gemma4", "tool_call_parser": "gemma4"}


@hookimpl
def register_model_loaders(register: Register) -> None:
    loaders = "atlas_model_gemma.loader:"
    register("gemma3_text", loaders + "Gemma3Loader", architectures=["Gemma3ForCausalLM"], defaults=GEMMA3_DEFAULTS)
    register(
        "gemma3", loaders + "Gemma3Loader", architectures=["Gemma3ForConditionalGeneration"], defaults=GEMMA3_DEFAULTS
    )
    register("gemma4_text", loaders + "Gemma4Loader", architectures=["Gemma4ForCausalLM"], defaults=GEMMA4_DEFAULTS)
    register(
        "gemma4", loaders + "Gemma4Loader", architectures=["Gemma4ForConditionalGeneration"], defaults=GEMMA4_DEFAULTS
    )


GEMMA_LAYERS = {
    "per_layer_inputs": "atlas_model_gemma.per_layer_inputs:PerLayerInputs",
    "per_layer_input_gate": "atlas_model_gemma.per_layer_inputs:PerLayerInputGate",
    "sandwich_decoder_layer": "atlas_model_gemma.sandwich:SandwichDecoderLayer",
    "siglip_encoder_layer": "atlas_model_gemma.siglip:SiglipEncoderLayer",
    "gemma3_multimodal_projector": "atlas_model_gemma.siglip:MultiModalProjector",
    "gemma4_vision_encoder_layer": "atlas_model_gemma.gemma4_tower:Gemma4VisionEncoderLayer",
    "gemma4_multimodal_embedder": "atlas_model_gemma.gemma4_tower:MultimodalEmbedder",
}
"""Layer types only the Gemma families use (contracts in docs/plugin-hooks.md)."""


@hookimpl
def register_layers(register: Register) -> None:
    for name, target in GEMMA_LAYERS.items():
        register(name, target)


@hookimpl
def register_op_groups(register: Register) -> None:
    register("gemma", "atlas_model_gemma.ops:GemmaOps")


@hookimpl
def register_tool_parsers(register: Register) -> None:
    register("gemma4", "atlas_model_gemma.tool_format:Gemma4Format")


@hookimpl
def register_reasoning_parsers(register: Register) -> None:
    register("gemma4", "atlas_model_gemma.reasoning:GEMMA4")
