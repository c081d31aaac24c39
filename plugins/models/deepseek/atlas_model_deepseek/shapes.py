"""The tensors a DeepSeek-V3 / Mistral Small 4 checkpoint holds, by name and shape (what
`DeepseekV3Loader.build` reads), for building the model from random weights.

Routed experts are described fused (``experts.gate_up_proj [E, 2I, H]``, ``experts.down_proj
[E, H, I]``, Mistral 4's layout), which the loader reads like DeepSeek-V3's per-expert tensors.
Multi-token-prediction layers past ``num_hidden_layers`` are not read, so not described.
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
        p = f"{prefix}layers.{i}."
        shapes |= {p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,)}
        shapes |= mla_shapes(p + "self_attn.", spec)
        if spec.is_moe_layer(i):
            shapes |= moe_shapes(p + "mlp.", spec, correction_bias)
        else:
            shapes |= swiglu_shapes(p + "mlp.", hidden, spec.intermediate_size)
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
