"""Which decoder layers of a Qwen-style MoE config have experts, and the tensors those layers hold in
place of a dense MLP: shared by the families whose text stacks follow transformers' ``Qwen3MoeDecoderLayer``
(Qwen3-MoE, Qwen3-VL-MoE)."""

from __future__ import annotations

from typing import Any

from atlas_core.model.layers.moe import config_num_experts


def qwen_sparse_layer(config: dict[str, Any], layer: int) -> bool:
    """Whether ``layer`` has experts: the config has routed experts, the layer is not in
    ``mlp_only_layers``, and it is every ``decoder_sparse_step``-th."""
    step = int(config.get("decoder_sparse_step") or 1)
    return (
        layer not in (config.get("mlp_only_layers") or [])
        and config_num_experts(config) > 0
        and (layer + 1) % step == 0
    )


def with_sparse_mlp_shapes(shapes: dict[str, tuple[int, ...]], config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """``shapes`` of a dense decoder (``model.layers.{i}.mlp.*`` SwiGLU), with each sparse layer's MLP
    replaced by its router and fused experts (``experts.gate_up_proj`` / ``experts.down_proj``)."""
    experts, hidden = config_num_experts(config), int(config["hidden_size"])
    inter = int(config["moe_intermediate_size"])
    shapes = dict(shapes)
    for layer in range(int(config["num_hidden_layers"])):
        if qwen_sparse_layer(config, layer):
            p = f"model.layers.{layer}.mlp."
            for name in ("gate_proj", "up_proj", "down_proj"):
                del shapes[f"{p}{name}.weight"]
            shapes |= {
                p + "gate.weight": (experts, hidden),
                p + "experts.gate_up_proj": (experts, 2 * inter, hidden),
                p + "experts.down_proj": (experts, hidden, inter),
            }
    return shapes
