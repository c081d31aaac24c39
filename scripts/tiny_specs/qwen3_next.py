"""Gated delta net hybrids: qwen3_next (fused projections, MoE + dense layers), qwen3_5 (split projections,
dense, saved as the multimodal checkpoint) and qwen3_5_moe (split projections, MoE, text-only checkpoint).

Every fixture mixes gated-delta-net layers with gated full-attention layers (partial rotary), uses
grouped value heads (4 value heads over 2 key heads) with a value head size different from the key
head size, and has a prompt of 150 tokens so that the chunked form of the delta rule crosses two
64-token chunk boundaries.
"""

from __future__ import annotations

from typing import Any

import torch
from tiny_checkpoint_specs import Spec
from transformers import (
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeTextConfig,
    Qwen3NextConfig,
)

LINEAR, FULL = "linear_attention", "full_attention"

HYBRID: dict[str, Any] = {
    "num_hidden_layers": 4,
    "layer_types": [LINEAR, FULL, LINEAR, FULL],
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "tie_word_embeddings": False,
}
MOE: dict[str, Any] = {
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 48,
}
PROMPT_LENGTHS = (1, 7, 40, 150)
PERTURB = 0.1
ZERO_CENTRED_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "norm.weight", "q_norm.weight",
                      "k_norm.weight")


def init_hybrid(name: str, param: torch.Tensor, noise: torch.Tensor) -> torch.Tensor | None:
    """Decoder norms scale by ``1 + w`` (zero-centred), so perturb them around 0; the gated delta net's
    ``A_log`` (decay rate ``exp(A_log)`` around 1) and ``dt_bias`` get spread values; its gated norm
    (``linear_attn.norm``, a plain weight) and everything else take the default rule."""
    if name.endswith("A_log"):
        return PERTURB * 5 * noise
    if name.endswith("dt_bias"):
        return PERTURB * 5 * noise
    if name.endswith(ZERO_CENTRED_NORMS) and "linear_attn" not in name and "visual" not in name:
        return PERTURB * noise
    return None


def qwen3_5_multimodal(**text: Any) -> Qwen3_5Config:
    """A Qwen3.5 vision-language config (the form Qwen3.5 checkpoints are published in) with the given text
    stack and a one-block vision tower."""
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": text["hidden_size"],
              "patch_size": 4, "num_position_embeddings": 16, "initializer_range": text["initializer_range"]}
    return Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=text.pop("tie_word_embeddings"))


SPECS: list[Spec] = [
    Spec(
        name="qwen3_next",
        config_cls=Qwen3NextConfig,
        config_kwargs={**HYBRID, **MOE, "mlp_only_layers": [2], "partial_rotary_factor": 0.25},
        seed=2001,
        init=init_hybrid,
        prompt_lengths=PROMPT_LENGTHS,
        description=(
            "Qwen3-Next: fused in_proj_qkvz / in_proj_ba (per key head grouping), layers GDN, attention, "
            "GDN, attention; MoE (8 experts, top-2, renormalised, sigmoid-gated shared expert) except layer 2 "
            "(dense MLP, mlp_only_layers); gated attention with partial rotary 0.25."
        ),
    ),
    Spec(
        name="qwen3_5",
        config_cls=qwen3_5_multimodal,
        config_kwargs={**HYBRID, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                       "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0], "mrope_interleaved": True}},
        seed=1102002,
        model_cls=Qwen3_5ForConditionalGeneration,
        init=init_hybrid,
        prompt_lengths=PROMPT_LENGTHS,
        description=(
            "Qwen3.5 dense saved as the vision-language checkpoint: text stack under model.language_model.*, "
            "a one-block vision tower under model.visual.*; split in_proj_qkv / in_proj_z / in_proj_b / "
            "in_proj_a; interleaved M-RoPE (text positions), partial rotary 0.25."
        ),
    ),
    Spec(
        name="qwen3_5_moe",
        config_cls=Qwen3_5MoeTextConfig,
        config_kwargs={**HYBRID, **MOE, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                       "partial_rotary_factor": 0.5}},
        seed=1902003,
        model_cls=Qwen3_5MoeForCausalLM,
        init=init_hybrid,
        prompt_lengths=PROMPT_LENGTHS,
        description=(
            "Qwen3.5 MoE, text-only checkpoint (model.*): split projections, every layer MoE (top-2 always "
            "renormalised, sigmoid-gated shared expert), partial rotary 0.5."
        ),
    ),
]
