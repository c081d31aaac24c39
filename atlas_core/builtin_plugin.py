"""Core's own registrations, made through the same hooks as any third-party plugin."""

from __future__ import annotations

from atlas_core.hookspecs import Register, hookimpl


@hookimpl
def register_gpu_backends(register: Register) -> None:
    register("numpy", "atlas_core.backends.numpy_backend:NumpyBackend", priority=0)


LAYERS = "atlas_core.model.layers."
CORE_LAYERS = {
    "rms_norm": LAYERS + "norm:RMSNorm",
    "attention": LAYERS + "attention:Attention",
    "shared_kv_attention": LAYERS + "attention:SharedKVAttention",
    "gated_attention": LAYERS + "gated_attention:GatedAttention",
    "mla": LAYERS + "mla:MultiHeadLatentAttention",
    "gated_delta_net": LAYERS + "gated_delta_net:GatedDeltaNet",
    "mamba2": LAYERS + "mamba2:Mamba2Mixer",
    "swiglu_mlp": LAYERS + "mlp:SwiGLUMLP",
    "geglu_mlp": LAYERS + "geglu:GeGLUMLP",
    "relu2_mlp": LAYERS + "relu2_mlp:SquaredReLUMLP",
    "moe": LAYERS + "moe:MoEFeedForward",
    "routed_experts": LAYERS + "moe:RoutedExperts",
    "per_layer_inputs": LAYERS + "per_layer_inputs:PerLayerInputs",
    "per_layer_input_gate": LAYERS + "per_layer_inputs:PerLayerInputGate",
    "pre_norm_decoder_layer": "atlas_core.model.transformer:PreNormDecoderLayer",
    "sandwich_decoder_layer": LAYERS + "sandwich:SandwichDecoderLayer",
}
"""Core's layer types: registered name -> ``module:Class`` (contracts in docs/plugin-hooks.md).
Family loaders get them with `ModelWeightLoader.layer_type`, so a plugin can supply its own."""


@hookimpl
def register_layers(register: Register) -> None:
    for name, target in CORE_LAYERS.items():
        register(name, target)


@hookimpl
def register_comm_backends(register: Register) -> None:
    register("single", "atlas_core.comm:SingleProcessComm")
