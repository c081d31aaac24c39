"""The tensors a Qwen3-Next / Qwen3.5 / Qwen3.5-MoE checkpoint holds, by name and shape (what
`Qwen3NextLoader.build` reads), for building the model from random weights.

The text stack sits under ``model.language_model.`` when the config nests it in ``text_config``
(Qwen3.5's vision-language checkpoints) and under ``model.`` otherwise. Qwen3-Next stores each gated
delta net's input projections fused by key head (``in_proj_qkvz``, ``in_proj_ba``), Qwen3.5 one
projection each; routed experts are described fused (``experts.gate_up_proj``), a layout the loader
reads like the per-expert one; a ``vision_config`` adds the vision tower (``model.visual.*``).
`mtp_shapes` describes the one multi-token-prediction layer (``mtp.*``) the published checkpoints
carry, which `Qwen3NextLoader.build_mtp` reads.
"""

from __future__ import annotations

from typing import Any

from atlas_model_qwen3_vl.attach import tower_shapes

from atlas_core.model.layers.moe import fused_expert_shapes
from atlas_model_qwen3_next.config import LINEAR_ATTENTION, HybridSpec

Shapes = dict[str, tuple[int, ...]]


def checkpoint_shapes(config: dict[str, Any]) -> Shapes:
    """Tensor name -> shape of every tensor the loader reads from a checkpoint with this ``config``."""
    spec = HybridSpec.from_config(config, "config.json")
    decoder = spec.decoder
    prefix = "model.language_model." if isinstance(config.get("text_config"), dict) else "model."
    hidden = decoder.hidden_size
    shapes: Shapes = {prefix + "embed_tokens.weight": (decoder.vocab_size, hidden), prefix + "norm.weight": (hidden,)}
    if not decoder.tie_word_embeddings:
        shapes["lm_head.weight"] = (decoder.vocab_size, hidden)
    fused_gdn = config.get("model_type") == "qwen3_next"
    for i, layer_type in enumerate(spec.layer_types):
        p = f"{prefix}layers.{i}."
        shapes |= {p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,)}
        if layer_type == LINEAR_ATTENTION:
            shapes |= gated_delta_net_shapes(p + "linear_attn.", spec, fused=fused_gdn)
        else:
            shapes |= gated_attention_shapes(p + "self_attn.", spec)
        if i in spec.moe_layers:
            shapes |= moe_shapes(p + "mlp.", spec)
        else:
            shapes |= swiglu_shapes(p + "mlp.", hidden, decoder.intermediate_size)
    if isinstance(config.get("vision_config"), dict):
        shapes |= tower_shapes(config["vision_config"])
    return shapes


def mtp_shapes(spec: HybridSpec) -> Shapes:
    """One MTP layer (`Qwen3NextLoader.build_mtp`): ``fc`` over [embedding, hidden], its norms, and a
    gated-attention decoder layer with a MoE (a dense MLP in dense models)."""
    hidden, p = spec.decoder.hidden_size, "mtp.layers.0."
    shapes: Shapes = {"mtp.fc.weight": (hidden, 2 * hidden)}
    for norm in (
        "mtp.pre_fc_norm_embedding",
        "mtp.pre_fc_norm_hidden",
        "mtp.norm",
        p + "input_layernorm",
        p + "post_attention_layernorm",
    ):
        shapes[norm + ".weight"] = (hidden,)
    mlp = (
        moe_shapes(p + "mlp.", spec) if spec.moe else swiglu_shapes(p + "mlp.", hidden, spec.decoder.intermediate_size)
    )
    return shapes | gated_attention_shapes(p + "self_attn.", spec) | mlp


def gated_delta_net_shapes(prefix: str, spec: HybridSpec, *, fused: bool) -> Shapes:
    """One GDN layer: input projections (fused by key head, or one per part), convolution, decay
    parameters, the gated norm and the output projection."""
    gdn, hidden = spec.gdn, spec.decoder.hidden_size
    if fused:
        ratio = gdn.num_value_heads // gdn.num_key_heads
        group = 2 * gdn.key_head_dim + 2 * ratio * gdn.value_head_dim
        projections: Shapes = {
            "in_proj_qkvz.weight": (gdn.num_key_heads * group, hidden),
            "in_proj_ba.weight": (gdn.num_key_heads * 2 * ratio, hidden),
        }
    else:
        projections = {
            "in_proj_qkv.weight": (gdn.conv_dim, hidden),
            "in_proj_z.weight": (gdn.value_dim, hidden),
            "in_proj_b.weight": (gdn.num_value_heads, hidden),
            "in_proj_a.weight": (gdn.num_value_heads, hidden),
        }
    projections |= {
        "conv1d.weight": (gdn.conv_dim, 1, gdn.conv_kernel),
        "A_log": (gdn.num_value_heads,),
        "dt_bias": (gdn.num_value_heads,),
        "norm.weight": (gdn.value_head_dim,),
        "out_proj.weight": (hidden, gdn.value_dim),
    }
    return {prefix + name: shape for name, shape in projections.items()}


def gated_attention_shapes(prefix: str, spec: HybridSpec) -> Shapes:
    """Gated attention: ``q_proj`` holds each head's query and gate rows; per-head q/k norms."""
    decoder = spec.decoder
    hidden, heads, head_dim = decoder.hidden_size, decoder.num_heads, decoder.head_dim
    kv_rows = decoder.num_kv_heads * head_dim
    shapes: Shapes = {
        "q_proj.weight": (heads * 2 * head_dim, hidden),
        "k_proj.weight": (kv_rows, hidden),
        "v_proj.weight": (kv_rows, hidden),
        "o_proj.weight": (hidden, heads * head_dim),
        "q_norm.weight": (head_dim,),
        "k_norm.weight": (head_dim,),
    }
    if decoder.qkv_bias:
        shapes |= {"q_proj.bias": (heads * 2 * head_dim,), "k_proj.bias": (kv_rows,), "v_proj.bias": (kv_rows,)}
    if decoder.o_bias:
        shapes["o_proj.bias"] = (hidden,)
    return {prefix + name: shape for name, shape in shapes.items()}


def swiglu_shapes(prefix: str, hidden: int, inter: int) -> Shapes:
    """``gate_proj`` / ``up_proj`` ``[inter, hidden]`` and ``down_proj`` ``[hidden, inter]`` under ``prefix``."""
    return {
        prefix + "gate_proj.weight": (inter, hidden),
        prefix + "up_proj.weight": (inter, hidden),
        prefix + "down_proj.weight": (hidden, inter),
    }


def moe_shapes(prefix: str, spec: HybridSpec) -> Shapes:
    """The router, the routed experts, the shared expert and its sigmoid gate."""
    moe, hidden = spec.moe, spec.decoder.hidden_size
    assert moe is not None  # moe_layers is empty without a MoESpec
    return {
        prefix + "gate.weight": (moe.num_experts, hidden),
        **fused_expert_shapes(prefix + "experts.", moe.num_experts, moe.intermediate_size, hidden),
        **swiglu_shapes(prefix + "shared_expert.", hidden, moe.shared_expert_intermediate_size),
        prefix + "shared_expert_gate.weight": (1, hidden),
    }
