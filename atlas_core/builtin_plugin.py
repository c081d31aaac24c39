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
    "pre_norm_decoder_layer": "atlas_core.model.transformer:PreNormDecoderLayer",
    "vision_block": LAYERS + "vision:VisionBlock",
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
    register("cpu", "atlas_core.comm.cpu:CpuComm")


CORE_OP_GROUPS = {
    "moe": "atlas_core.backends.ops.moe:MoEOps",
    "mla": "atlas_core.backends.ops.mla:MLAOps",
    "gated_delta": "atlas_core.backends.ops.gated_delta:GatedDeltaOps",
    "mamba2": "atlas_core.backends.ops.mamba2:Mamba2Ops",
    "vision": "atlas_core.backends.ops.vision:VisionOps",
}
"""Core's op groups: shared primitives that several model architectures use."""


@hookimpl
def register_op_groups(register: Register) -> None:
    for name, target in CORE_OP_GROUPS.items():
        register(name, target)


TOOLS = "atlas_core.parsing.tools."
CORE_TOOL_PARSERS = {
    "hermes": TOOLS + "json_formats:HermesFormat",
    "json": TOOLS + "json_formats:JsonFormat",
    "mistral": TOOLS + "json_formats:MistralFormat",
    "nemotron": TOOLS + "json_formats:NemotronFormat",
    "qwen3_coder": TOOLS + "xml_formats:Qwen3CoderFormat",
}
"""Core's tool-call formats, those several families write: registered name -> ``module:ToolFormat subclass``."""

CORE_REASONING_PARSERS = {
    "qwen3": "atlas_core.parsing.reasoning:QWEN3",
    "deepseek_r1": "atlas_core.parsing.reasoning:DEEPSEEK_R1",
    "mistral": "atlas_core.parsing.reasoning:MISTRAL",
}
"""Core's reasoning formats: registered name -> ``module:ReasoningFormat instance``."""


@hookimpl
def register_tool_parsers(register: Register) -> None:
    for name, target in CORE_TOOL_PARSERS.items():
        register(name, target)


@hookimpl
def register_reasoning_parsers(register: Register) -> None:
    for name, target in CORE_REASONING_PARSERS.items():
        register(name, target)
