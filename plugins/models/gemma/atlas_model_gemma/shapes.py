"""The tensors a Gemma 3 / Gemma 4 checkpoint holds, by name and shape (what `GemmaLoader.build`
reads), for building the model from random weights.

The text stack is described where the published checkpoints keep it: under ``model.`` for the
text-only classes, and for vision-language configs (a ``text_config``) under ``language_model.model.``
(Gemma 3, saved before transformers 4.52) or ``model.language_model.`` (Gemma 4). Gemma 4's KV-shared
layers have queries only and, with ``use_double_wide_mlp``, an MLP twice as wide; its routed experts
are stored fused (``experts.gate_up_proj [E, 2I, H]``).
"""

from __future__ import annotations

from typing import Any

from atlas_core.model.layers.moe import fused_expert_shapes
from atlas_model_gemma.config import FULL, Family, GemmaLayerSpec, GemmaSpec, parse

Shapes = dict[str, tuple[int, ...]]
SANDWICH_NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)
VISION_LANGUAGE_PREFIXES: dict[Family, str] = {"gemma3": "language_model.model.", "gemma4": "model.language_model."}


def checkpoint_shapes(config: dict[str, Any], family: Family) -> Shapes:
    """Tensor name -> shape of every tensor the loader reads from a checkpoint with this ``config``."""
    spec = parse(config, family, "config.json")
    prefix = VISION_LANGUAGE_PREFIXES[family] if isinstance(config.get("text_config"), dict) else "model."
    hidden, vocab = int(spec["hidden_size"]), int(spec["vocab_size"])
    shapes: Shapes = {prefix + "embed_tokens.weight": (vocab, hidden), prefix + "norm.weight": (hidden,)}
    if not spec.tie_word_embeddings:
        shapes["lm_head.weight"] = (vocab, hidden)
    num_layers, per_layer = len(spec.layers), spec.per_layer_input_size
    if family == "gemma4" and per_layer:
        shapes |= {
            prefix + "embed_tokens_per_layer.weight": (int(spec["vocab_size_per_layer_input"]), num_layers * per_layer),
            prefix + "per_layer_model_projection.weight": (num_layers * per_layer, hidden),
            prefix + "per_layer_projection_norm.weight": (per_layer,),
        }
    for i, layer in enumerate(spec.layers):
        p = f"{prefix}layers.{i}."
        shapes |= {p + name + ".weight": (hidden,) for name in SANDWICH_NORMS}
        shapes |= attention_shapes(p + "self_attn.", spec, i, layer)
        shared = layer.kv_source != i
        wide = family == "gemma4" and shared and bool(spec.text.get("use_double_wide_mlp"))
        shapes |= mlp_shapes(p + "mlp.", hidden, int(spec["intermediate_size"]) * (2 if wide else 1))
        if family == "gemma4":
            shapes |= gemma4_layer_shapes(p, spec)
    return shapes


def attention_shapes(prefix: str, spec: GemmaSpec, index: int, layer: GemmaLayerSpec) -> Shapes:
    """Layer ``index``'s attention: queries always; keys (and values, unless Gemma 4's full layers take
    them from the keys) only in layers that compute their own KV; q/k norms; biases with ``attention_bias``."""
    hidden, heads = int(spec["hidden_size"]), int(spec["num_attention_heads"])
    q_rows, kv_rows = heads * layer.head_dim, layer.num_kv_heads * layer.head_dim
    shared = layer.kv_source != index
    values_from_keys = spec.family == "gemma4" and bool(spec["attention_k_eq_v"]) and layer.layer_type == FULL
    rows = {"q": q_rows}
    if not shared:
        rows |= {"k": kv_rows} if values_from_keys else {"k": kv_rows, "v": kv_rows}
    shapes: Shapes = {f"{name}_proj.weight": (count, hidden) for name, count in rows.items()}
    shapes |= {"o_proj.weight": (hidden, q_rows), "q_norm.weight": (layer.head_dim,)}
    if not shared:
        shapes["k_norm.weight"] = (layer.head_dim,)
    if spec["attention_bias"]:
        shapes |= {f"{name}_proj.bias": (count,) for name, count in rows.items()}
        shapes["o_proj.bias"] = (hidden,)
    return {prefix + name: shape for name, shape in shapes.items()}


def mlp_shapes(prefix: str, hidden: int, inter: int) -> Shapes:
    """The GeGLU MLP: ``gate_proj`` / ``up_proj`` ``[inter, hidden]``, ``down_proj`` ``[hidden, inter]``."""
    return {
        prefix + "gate_proj.weight": (inter, hidden),
        prefix + "up_proj.weight": (inter, hidden),
        prefix + "down_proj.weight": (hidden, inter),
    }


def gemma4_layer_shapes(prefix: str, spec: GemmaSpec) -> Shapes:
    """What a Gemma 4 layer adds: its ``layer_scalar``, the per-layer input gate (with per-layer
    inputs), and the parallel MoE block's router, experts and norms (with ``enable_moe_block``)."""
    hidden, per_layer = int(spec["hidden_size"]), spec.per_layer_input_size
    shapes: Shapes = {prefix + "layer_scalar": (1,)}
    if per_layer:
        shapes |= {
            prefix + "per_layer_input_gate.weight": (per_layer, hidden),
            prefix + "per_layer_projection.weight": (hidden, per_layer),
            prefix + "post_per_layer_input_norm.weight": (hidden,),
        }
    if spec.router is not None:
        experts = spec.router.num_experts
        norms = ("post_feedforward_layernorm_1", "pre_feedforward_layernorm_2", "post_feedforward_layernorm_2")
        shapes |= {prefix + name + ".weight": (hidden,) for name in norms}
        shapes |= {
            prefix + "router.proj.weight": (experts, hidden),
            prefix + "router.scale": (hidden,),
            prefix + "router.per_expert_scale": (experts,),
            **fused_expert_shapes(prefix + "experts.", experts, int(spec["moe_intermediate_size"]), hidden),
        }
    return shapes
