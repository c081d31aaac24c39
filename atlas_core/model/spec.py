"""`DecoderSpec`: the shape of a dense decoder-only transformer, read from ``config.json``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from atlas_core.errors import ModelLoadError
from atlas_core.model.rope import RopeSpec


def require(config: dict[str, Any], key: str, origin: str = "config.json") -> Any:
    """``config[key]``, or a `ModelLoadError` naming the file and the missing key."""
    if key not in config or config[key] is None:
        raise ModelLoadError(f"{origin}: required key {key!r} is missing")
    return config[key]


@dataclass(frozen=True)
class DecoderSpec:
    """Everything the generic dense decoder needs to know about a checkpoint."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope: RopeSpec
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False

    @classmethod
    def from_config(cls, config: dict[str, Any], origin: str = "config.json", **overrides: Any) -> DecoderSpec:
        """Parse the common Hugging Face keys; families pass what their config implies as overrides."""
        hidden = int(require(config, "hidden_size", origin))
        heads = int(require(config, "num_attention_heads", origin))
        head_dim = int(config.get("head_dim") or hidden // heads)
        activation = config.get("hidden_act", config.get("hidden_activation", "silu"))
        if activation != "silu":
            raise ModelLoadError(
                f"{origin}: hidden_act {activation!r} is not supported by the dense decoder (only 'silu')"
            )
        values: dict[str, Any] = dict(
            vocab_size=int(require(config, "vocab_size", origin)),
            hidden_size=hidden,
            num_layers=int(require(config, "num_hidden_layers", origin)),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            intermediate_size=int(require(config, "intermediate_size", origin)),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope=RopeSpec.from_config(config, head_dim),
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=bool(config.get("attention_bias", False)),
            o_bias=bool(config.get("attention_bias", False)),
            mlp_bias=bool(config.get("mlp_bias", False)),
        )
        values.update(overrides)
        spec = cls(**values)
        if spec.num_heads % spec.num_kv_heads:
            raise ModelLoadError(
                f"{origin}: num_attention_heads ({spec.num_heads}) must be a multiple of "
                f"num_key_value_heads ({spec.num_kv_heads})"
            )
        return spec
