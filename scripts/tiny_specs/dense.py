"""Dense llama-like fixtures: llama (rope variants, tied, sharded), mistral (bf16), qwen2, qwen3."""

from __future__ import annotations

import torch
from tiny_checkpoint_specs import Spec
from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

SPECS: list[Spec] = [
    Spec(
        name="llama",
        config_cls=LlamaConfig,
        config_kwargs={"num_hidden_layers": 3, "tie_word_embeddings": False},
        seed=1001,
        description="Llama, 3 layers, GQA (4 q heads / 2 kv heads), untied lm_head, default RoPE.",
    ),
    Spec(
        name="llama3_tied",
        config_cls=LlamaConfig,
        config_kwargs={
            "num_hidden_layers": 2,
            "tie_word_embeddings": True,
            "attention_bias": False,
            "mlp_bias": False,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
        seed=1002,
        description=(
            "Llama with llama3 RoPE scaling (factor 8, low/high freq factor 1/4, "
            "original_max_position_embeddings 64, so at head_dim 16 the 8 frequencies "
            "cover all three regimes: kept, smoothed, divided by 8) and tied embeddings "
            "(no lm_head.weight in the checkpoint)."
        ),
    ),
    Spec(
        name="llama_linear_rope",
        config_cls=LlamaConfig,
        config_kwargs={
            "num_hidden_layers": 2,
            "tie_word_embeddings": False,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        },
        seed=1003,
        max_shard_size="150KB",
        description=(
            "Llama with linear RoPE scaling (factor 2: positions divided by 2), saved "
            "SHARDED (several model-*-of-*.safetensors + model.safetensors.index.json)."
        ),
    ),
    Spec(
        name="llama_yarn",
        config_cls=LlamaConfig,
        config_kwargs={
            "num_hidden_layers": 2,
            "tie_word_embeddings": False,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
        seed=1004,
        description=(
            "Llama with YaRN RoPE (factor 4, original_max_position_embeddings 64, "
            "beta_fast/beta_slow defaults 32/1, truncate default true): blended "
            "inv_freq and cos/sin scaled by attention_factor 0.1*ln(4)+1."
        ),
    ),
    Spec(
        name="mistral",
        config_cls=MistralConfig,
        config_kwargs={
            "num_hidden_layers": 2,
            "tie_word_embeddings": False,
            "sliding_window": None,
        },
        seed=1005,
        save_dtype=torch.bfloat16,
        description=(
            "Mistral (no sliding window), weights stored in bfloat16; the reference "
            "is the bf16 checkpoint upcast to float32."
        ),
    ),
    Spec(
        name="qwen2",
        config_cls=Qwen2Config,
        config_kwargs={"num_hidden_layers": 2, "tie_word_embeddings": False},
        seed=1006,
        description="Qwen2: q/k/v projections have biases (o_proj has none), untied.",
    ),
    Spec(
        name="qwen3",
        config_cls=Qwen3Config,
        config_kwargs={"num_hidden_layers": 2, "tie_word_embeddings": False},
        seed=1007,
        description=(
            "Qwen3: per-head RMSNorm on q and k (q_norm/k_norm, weights perturbed), "
            "explicit head_dim 16, GQA 4/2, untied."
        ),
    ),
    Spec(
        name="qwen3_tied",
        config_cls=Qwen3Config,
        config_kwargs={"num_hidden_layers": 2, "tie_word_embeddings": True},
        seed=1008,
        description="Qwen3 with tied embeddings (no lm_head.weight in the checkpoint).",
    ),
]
