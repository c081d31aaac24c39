"""The tiny checkpoints `make_tiny_checkpoints.py` generates: one `Spec` per fixture folder.

Adding a family or variant means adding a `Spec` here; the generator does the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

WEIGHT_STD = 0.1  # default 0.02 leaves the top-2 logits nearly tied

COMMON: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "initializer_range": WEIGHT_STD,
}


@dataclass
class Spec:
    name: str
    config_cls: type
    config_kwargs: dict[str, Any]
    seed: int
    description: str
    save_dtype: torch.dtype = torch.float32
    max_shard_size: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


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
