"""Multi-head latent attention + Mixture-of-Experts fixtures: deepseek_v3 (with and without a query
low-rank), mistral4, and mistral4 inside a mistral3 vision-language checkpoint.

MLA shapes everywhere: 4 heads, kv_lora_rank 32, qk_nope_head_dim 16, qk_rope_head_dim 8 and
v_head_dim 12 (different from qk_nope_head_dim, so mixing the two up fails). ``head_dim`` is what
transformers' RoPE reads: qk_rope_head_dim for DeepSeek-V3, the whole query head (24, with
partial_rotary_factor 1/3) for Mistral 4. MoE layers have 8
experts of width 32 and route each token to 2.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers
from tiny_checkpoint_specs import Spec
from transformers import DeepseekV3Config, Mistral3Config, Mistral4Config, PixtralVisionConfig

CORRECTION_BIAS_STD = 0.15
"""Comparable to the spread of the tiny routers' sigmoid scores, so the bias changes which experts win."""

MLA: dict[str, Any] = {
    "num_key_value_heads": 4, "head_dim": 8, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12,
    "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "tie_word_embeddings": False,
}


class DeepseekV3ForCausalLM(transformers.DeepseekV3ForCausalLM):
    """DeepSeek-V3 whose ``e_score_correction_bias`` buffers (zeros in transformers, and not parameters, so
    the generator's ``init`` hook never sees them) are drawn from the seeded global generator. The class
    name is transformers' own, so the saved config names the real architecture; on reload the saved
    buffers replace the draw."""

    def __init__(self, config: DeepseekV3Config) -> None:
        super().__init__(config)
        with torch.no_grad():
            for layer in self.model.layers:
                gate = getattr(layer.mlp, "gate", None)
                if gate is not None:
                    gate.e_score_correction_bias.normal_(0.0, CORRECTION_BIAS_STD)


def mistral3_with_mistral4_text(**text_kwargs: Any) -> Mistral3Config:
    """A vision-language ``mistral3`` config around a Mistral 4 text stack, with a one-layer vision tower.
    The top-level ``tie_word_embeddings`` (Mistral3Config's default, True) decides the LM head's tying."""
    text = Mistral4Config(**text_kwargs)
    vision = PixtralVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=64, patch_size=16,
        head_dim=16,
    )
    return Mistral3Config(text_config=text, vision_config=vision, image_token_index=10)


def vision_norm_init(name: str, param: torch.Tensor, noise: torch.Tensor) -> torch.Tensor | None:
    """The Pixtral tower's ``ln_pre`` RMSNorm weight (1-D, no "norm" in its name) perturbed like any norm."""
    return 1.0 + 0.1 * noise if name.endswith("ln_pre.weight") else None


MISTRAL4_ROPE: dict[str, Any] = {
    "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
    "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1,
}
"""original_max_position_embeddings 16: the Llama-4 query scale 1 + 0.1 ln(1 + floor(p / 16)) grows within
the 40-token prompts, and YaRN's ramp spans the 4 rotary frequencies."""

MISTRAL4: dict[str, Any] = {
    **MLA, "head_dim": 24, "num_hidden_layers": 2, "q_lora_rank": 48, "first_k_dense_replace": 1, "n_group": 2,
    "topk_group": 1,
    "routed_scaling_factor": 1.5, "rope_parameters": MISTRAL4_ROPE,
}

SPECS: list[Spec] = [
    Spec(
        name="deepseek_v3",
        config_cls=DeepseekV3Config,
        config_kwargs={
            **MLA, "num_hidden_layers": 3, "q_lora_rank": 48, "first_k_dense_replace": 1, "n_group": 4,
            "topk_group": 2, "n_shared_experts": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
            "rope_parameters": {
                "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
                "mscale": 1.0, "mscale_all_dim": 0.8, "beta_fast": 32.0, "beta_slow": 1.0,
            },
        },
        seed=4001,
        model_cls=DeepseekV3ForCausalLM,
        description=(
            "DeepSeek-V3: MLA with a query low-rank (q_lora_rank 48, q_a_layernorm), interleaved RoPE on 8 of the "
            "24 query dims, YaRN (factor 4, mscale 1 / mscale_all_dim 0.8: cos/sin scaled by their ratio and the "
            "softmax scale by mscale(0.8)^2); layer 0 dense, layers 1-2 MoE: sigmoid routing + "
            "e_score_correction_bias (std 0.15), 4 groups of 2 experts with the best 2 groups eligible, top-2 "
            "renormalised, routed_scaling_factor 2.5, one shared expert; experts saved per expert."
        ),
    ),
    Spec(
        name="deepseek_v3_no_q_lora",
        config_cls=DeepseekV3Config,
        config_kwargs={
            **MLA, "num_hidden_layers": 2, "q_lora_rank": None, "first_k_dense_replace": 1, "n_group": 1,
            "topk_group": 1, "n_shared_experts": 2, "routed_scaling_factor": 1.0, "norm_topk_prob": False,
            "attention_bias": True, "rope_interleave": False,
        },
        seed=4002,
        model_cls=DeepseekV3ForCausalLM,
        description=(
            "DeepSeek-V3 without a query low-rank (one q_proj), attention_bias (kv_a_proj_with_mqa and o_proj "
            "biases), rotate-half RoPE (rope_interleave false), default RoPE; layer 0 dense, layer 1 MoE with one "
            "group, weights not renormalised, two shared experts (one MLP of width 64)."
        ),
    ),
    Spec(
        name="mistral4",
        config_cls=Mistral4Config,
        config_kwargs=MISTRAL4,
        seed=4003,
        model_cls=transformers.Mistral4ForCausalLM,
        description=(
            "Mistral Small 4's text stack: MLA (q_lora_rank 48, interleaved RoPE over the last 8 of 24 query "
            "dims via partial_rotary_factor), YaRN factor 4 over original_max_position_embeddings 16 with the "
            "Llama-4 query scale (beta 0.1); layer 0 dense, layer 1 MoE: softmax routing, 2 groups of 4 with "
            "the best one eligible, top-2 renormalised, routed_scaling_factor 1.5, one shared expert; experts "
            "saved fused (experts.gate_up_proj [8, 64, 64], experts.down_proj [8, 64, 32])."
        ),
    ),
    Spec(
        name="mistral4_vl",
        config_cls=mistral3_with_mistral4_text,
        config_kwargs=MISTRAL4,
        seed=4004,
        model_cls=transformers.Mistral3ForConditionalGeneration,
        init=vision_norm_init,
        description=(
            "The mistral4 fixture's text stack inside a mistral3 vision-language checkpoint (as Mistral Small 4 "
            "ships): text weights under model.language_model.*, a one-layer Pixtral vision tower and projector "
            "(not used by text prompts), and the top-level tie_word_embeddings (True) tying lm_head to the "
            "embeddings."
        ),
    ),
]
