"""The tensors a DeepSeek-V3 / Mistral Small 4 checkpoint holds, by name and shape (what
`DeepseekV3Loader.build` reads), for building the model from random weights.

Routed experts are described fused (``experts.gate_up_proj [E, 2I, H]``, ``experts.down_proj
[E, H, I]``, Mistral 4's layout), which the loader reads like DeepSeek-V3's per-expert tensors.
The multi-token-prediction layers past ``num_hidden_layers`` (read only for speculative decoding) are
described apart (`mtp_shapes`).
"""

from __future__ import annotations

from atlas_core.model.layers.moe import fused_expert_shapes
from atlas_model_deepseek.spec import DeepseekSpec

Shapes = dict[str, tuple[int, ...]]


def checkpoint_shapes(spec: DeepseekSpec, prefix: str, lm_head: str | None, correction_bias: str | None) -> Shapes:
    """Every tensor of a checkpoint of ``spec`` whose decoder sits under ``prefix``; ``lm_head``: the LM
    head's name (None when tied to the embeddings); ``correction_bias``: the router's bias under each
    MoE layer's ``mlp.`` (None: none)."""
    hidden = spec.hidden_size
    shapes: Shapes = {prefix + "embed_tokens.weight": (spec.vocab_size, hidden), prefix + "norm.weight": (hidden,)}
    if lm_head is not None:
        shapes[lm_head] = (spec.vocab_size, hidden)
    for i in range(spec.num_layers):
        shapes |= decoder_layer_shapes(f"{prefix}layers.{i}.", spec, i, correction_bias)
    return shapes


def decoder_layer_shapes(prefix: str, spec: DeepseekSpec, index: int, correction_bias: str | None) -> Shapes:
    """Decoder layer ``index`` under ``prefix``: its norms, MLA attention and dense MLP or MoE block."""
    hidden = spec.hidden_size
    shapes: Shapes = {
        prefix + "input_layernorm.weight": (hidden,),
        prefix + "post_attention_layernorm.weight": (hidden,),
    }
    shapes |= mla_shapes(prefix + "self_attn.", spec)
    if spec.is_moe_layer(index):
        return shapes | moe_shapes(prefix + "mlp.", spec, correction_bias)
    return shapes | swiglu_shapes(prefix + "mlp.", hidden, spec.intermediate_size)


def mtp_shapes(spec: DeepseekSpec, prefix: str, correction_bias: str | None) -> Shapes:
    """DeepSeek-V3's ``num_nextn_predict_layers`` multi-token-prediction layers after the decoder's
    (`DeepseekV3Loader.build_mtp`): ``enorm``, ``hnorm``, ``eh_proj``, a decoder layer and
    ``shared_head.norm``. The layers' ``embed_tokens`` and ``shared_head.head``, in published checkpoints
    copies of the target's that `build_mtp` shares, are left out: the target's serve."""
    hidden = spec.hidden_size
    shapes: Shapes = {}
    for index in range(spec.num_layers, spec.num_layers + spec.num_mtp_layers):
        p = f"{prefix}layers.{index}."
        shapes |= {
            p + "enorm.weight": (hidden,),
            p + "hnorm.weight": (hidden,),
            p + "eh_proj.weight": (hidden, 2 * hidden),
            p + "shared_head.norm.weight": (hidden,),
        }
        shapes |= decoder_layer_shapes(p, spec, index, correction_bias)
    return shapes


def mla_shapes(prefix: str, spec: DeepseekSpec) -> Shapes:
    """Multi-head latent attention: the query projection (low-rank or one ``q_proj``), the compressed
    KV projection and its norm, ``kv_b_proj`` and the output projection; biases with ``attention_bias``."""
    mla, hidden = spec.mla, spec.hidden_size
    kv_width = mla.latent_dim + mla.rope_dim
    shapes: Shapes = {
        "kv_a_proj_with_mqa.weight": (kv_width, hidden),
        "kv_a_layernorm.weight": (mla.latent_dim,),
        "kv_b_proj.weight": (mla.heads * (mla.nope_dim + mla.v_dim), mla.latent_dim),
        "o_proj.weight": (hidden, mla.heads * mla.v_dim),
    }
    if mla.q_lora_rank is None:
        shapes["q_proj.weight"] = (mla.q_width, hidden)
    else:
        shapes |= {
            "q_a_proj.weight": (mla.q_lora_rank, hidden),
            "q_a_layernorm.weight": (mla.q_lora_rank,),
            "q_b_proj.weight": (mla.q_width, mla.q_lora_rank),
        }
    if spec.attention_bias:
        shapes |= {"kv_a_proj_with_mqa.bias": (kv_width,), "o_proj.bias": (hidden,)}
        if mla.q_lora_rank is not None:
            shapes["q_a_proj.bias"] = (mla.q_lora_rank,)
    return {prefix + name: shape for name, shape in shapes.items()}


def swiglu_shapes(prefix: str, hidden: int, inter: int) -> Shapes:
    """``gate_proj`` / ``up_proj`` ``[inter, hidden]`` and ``down_proj`` ``[hidden, inter]`` under ``prefix``."""
    return {
        prefix + "gate_proj.weight": (inter, hidden),
        prefix + "up_proj.weight": (inter, hidden),
        prefix + "down_proj.weight": (hidden, inter),
    }


def moe_shapes(prefix: str, spec: DeepseekSpec, correction_bias: str | None) -> Shapes:
    """The router (and its correction bias), the routed experts, and the shared experts as one MLP of
    ``n_shared_experts * moe_intermediate_size``."""
    hidden, experts, inter = spec.hidden_size, spec.router.num_experts, spec.moe_intermediate_size
    shapes: Shapes = {
        prefix + "gate.weight": (experts, hidden),
        **fused_expert_shapes(prefix + "experts.", experts, inter, hidden),
    }
    if correction_bias is not None:
        shapes[prefix + correction_bias] = (experts,)
    if spec.num_shared_experts:
        shapes |= swiglu_shapes(prefix + "shared_experts.", hidden, spec.num_shared_experts * inter)
    return shapes
