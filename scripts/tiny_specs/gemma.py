"""Gemma fixtures: gemma3 (text), gemma3 saved as its vision-language checkpoint, gemma4 (dense, with
per-layer inputs, KV sharing and k = v attention) and gemma4_moe.

Every fixture mixes sliding-window (window 8) and full-attention layers with different RoPE per
layer type, and two of its four prompts (19 and 40 tokens) are longer than the window. Parameters
that transformers initialises to constants are perturbed so that forgetting them fails parity:
Gemma 3's zero-centred ``1 + w`` norms around 0, Gemma 4's plain norms around 1, the router's input
and per-expert scales, and (through a `Gemma4ForCausalLM` subclass) Gemma 4's per-layer ``layer_scalar``
buffers, which the generator's parameter hook cannot reach.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers
from tiny_checkpoint_specs import Spec
from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig, Gemma4TextConfig

SLIDING, FULL = "sliding_attention", "full_attention"
PERTURB = 0.1
WINDOW = 8


def init_gemma3(name: str, param: torch.Tensor, noise: torch.Tensor) -> torch.Tensor | None:
    """Gemma 3's RMSNorms scale by ``1 + w``: perturb ``w`` around 0 (a missing ``+ 1`` then scales by
    about 0.1 instead of about 1). The vision tower's attention-pooling bias takes the bias rule."""
    if param.ndim == 1 and name.endswith("norm.weight") and "vision_tower" not in name:
        return PERTURB * noise
    if name.endswith("in_proj_bias"):
        return PERTURB * noise
    return None


def init_gemma4(name: str, param: torch.Tensor, noise: torch.Tensor) -> torch.Tensor | None:
    """The router's input scale and per-expert scales (ones in transformers) get spread values."""
    if name.endswith(("router.scale", "router.per_expert_scale")):
        return 1.0 + 3 * PERTURB * noise
    return None


class Gemma4ForCausalLM(transformers.Gemma4ForCausalLM):
    """transformers' class (same name, so the saved ``architectures`` entry is the real one) whose
    ``layer_scalar`` buffers start at distinct values instead of 1: layer i gets ``0.6 + 0.15 i``
    (a checkpoint loaded through it keeps the values it stores)."""

    def __init__(self, config: Gemma4TextConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for i, layer in enumerate(self.model.layers):
                layer.layer_scalar.fill_(0.6 + 0.15 * i)


def gemma3_multimodal(**text: Any) -> Gemma3Config:
    """A Gemma 3 vision-language config (the form most Gemma 3 checkpoints are published in) with the
    given text stack and a one-layer SigLIP vision tower."""
    vision = {"model_type": "siglip_vision_model", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
              "num_attention_heads": 2, "image_size": 28, "patch_size": 14}
    return Gemma3Config(text_config=Gemma3TextConfig(**text), vision_config=vision, mm_tokens_per_image=4)


GEMMA3: dict[str, Any] = {
    "num_hidden_layers": 4,
    "layer_types": [SLIDING, SLIDING, FULL, SLIDING],
    "sliding_window": WINDOW,
    "query_pre_attn_scalar": 24,
    "final_logit_softcapping": 8.0,
    "rope_parameters": {
        SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
        FULL: {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0},
    },
}
GEMMA4: dict[str, Any] = {
    "sliding_window": WINDOW,
    "global_head_dim": 32,
    "num_global_key_value_heads": 1,
    "attention_k_eq_v": True,
    "final_logit_softcapping": 10.0,
    "rope_parameters": {
        SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
        FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
    },
}

SPECS: list[Spec] = [
    Spec(
        name="gemma3",
        config_cls=Gemma3TextConfig,
        config_kwargs=GEMMA3,
        seed=3001,
        init=init_gemma3,
        description=(
            "Gemma 3 text (Gemma3ForCausalLM), tied: layers sliding, sliding, full, sliding (window 8); "
            "default RoPE theta 1e4 on sliding layers, linear RoPE (factor 2, theta 1e6) on the full layer; "
            "query_pre_attn_scalar 24 (not head_dim); final logit soft-cap 8; (1 + w) norms perturbed around 0."
        ),
    ),
    Spec(
        name="gemma3_multimodal",
        config_cls=gemma3_multimodal,
        config_kwargs={**GEMMA3, "num_hidden_layers": 2, "layer_types": [SLIDING, FULL]},
        seed=3002,
        model_cls=Gemma3ForConditionalGeneration,
        init=init_gemma3,
        description=(
            "Gemma 3 saved as Gemma3ForConditionalGeneration (model_type gemma3, text settings under "
            "text_config, text weights under model.language_model.*, a one-layer SigLIP vision tower); "
            "2 layers (sliding, full). The reference is the vision-language model fed token ids only."
        ),
    ),
    Spec(
        name="gemma4",
        config_cls=Gemma4TextConfig,
        config_kwargs={
            **GEMMA4,
            "num_hidden_layers": 5,
            "layer_types": [SLIDING, SLIDING, FULL, SLIDING, FULL],
            "num_kv_shared_layers": 2,
            "use_double_wide_mlp": True,
            "hidden_size_per_layer_input": 8,
            "vocab_size_per_layer_input": 256,
            "tie_word_embeddings": True,
        },
        seed=4001,
        model_cls=Gemma4ForCausalLM,
        init=init_gemma4,
        description=(
            "Gemma 4 dense (Gemma4ForCausalLM), tied, 5 layers: sliding, sliding, full, sliding, full (window 8). "
            "Full layers: head_dim 32 with 1 KV head, k = v attention (no v_proj), proportional RoPE "
            "(partial 0.25, theta 1e6); sliding layers: head_dim 16, 2 KV heads, default RoPE. The last 2 layers "
            "share KV (layer 3 reads layer 1's, layer 4 reads layer 2's) and have double-wide MLPs. Per-layer "
            "inputs of width 8; layer scalars 0.6 + 0.15 i; final logit soft-cap 10."
        ),
    ),
    Spec(
        name="gemma4_moe",
        config_cls=Gemma4TextConfig,
        config_kwargs={
            **GEMMA4,
            "num_hidden_layers": 3,
            "layer_types": [SLIDING, SLIDING, FULL],
            "hidden_size_per_layer_input": 0,
            "enable_moe_block": True,
            "num_experts": 4,
            "top_k_experts": 2,
            "moe_intermediate_size": 32,
            "tie_word_embeddings": False,
        },
        seed=4002,
        model_cls=Gemma4ForCausalLM,
        init=init_gemma4,
        description=(
            "Gemma 4 MoE (Gemma4ForCausalLM with enable_moe_block), untied, 3 layers: sliding, sliding, full "
            "(window 8). Every layer runs the dense GeGLU MLP beside 4 experts (top-2, softmax renormalised, "
            "fused gate_up_proj) routed on the unit-normed residual; router input scale and per-expert scales "
            "perturbed; k = v attention and proportional RoPE on the full layer; no per-layer inputs."
        ),
    ),
]
