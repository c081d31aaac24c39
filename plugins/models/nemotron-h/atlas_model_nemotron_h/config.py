"""`NemotronHSpec`: a Nemotron-H checkpoint's shape, read from ``config.json``.

Both config forms are read: transformers 5's ``layers_block_type`` list (``linear_attention`` /
``full_attention`` / ``mlp`` / ``moe``, or the older ``mamba`` / ``attention``) and NVIDIA's original
``hybrid_override_pattern`` string (``M`` Mamba-2, ``*`` attention, ``-`` MLP, ``E`` MoE), together
with the ``mamba_*`` aliases of the original configs. Keys left out take transformers' defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from atlas_core.backends.ops.moe import RouterSpec
from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.mamba2 import Mamba2Shape
from atlas_core.model.spec import require

LayerKind = Literal["mamba", "attention", "mlp", "moe"]

PATTERN_LETTERS: dict[str, LayerKind] = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
LIST_NAMES: dict[str, LayerKind] = {
    "linear_attention": "mamba",
    "mamba": "mamba",
    "full_attention": "attention",
    "attention": "attention",
    "mlp": "mlp",
    "moe": "moe",
}


@dataclass(frozen=True)
class MoESettings:
    """The routed experts (``moe_intermediate_size`` each, non-gated squared ReLU), the always-on shared
    expert (``shared_intermediate_size``), and the optional latent width the routed experts work in."""

    router: RouterSpec
    intermediate_size: int
    shared_intermediate_size: int
    latent_size: int | None


@dataclass(frozen=True)
class NemotronHSpec:
    """Everything the Nemotron-H loader needs: one block kind per layer and each kind's sizes."""

    vocab_size: int
    hidden_size: int
    layer_kinds: tuple[LayerKind, ...]
    norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    mlp_bias: bool
    mamba: Mamba2Shape
    mamba_bias: bool
    conv_bias: bool
    moe: MoESettings | None

    @classmethod
    def from_config(cls, config: dict[str, Any], origin: str = "config.json") -> NemotronHSpec:
        """The spec of a ``nemotron_h`` config; anything unsupported or inconsistent raises
        `ModelLoadError` naming ``origin`` and the key."""
        kinds = layer_kinds(config, origin)
        for key, want in (("mlp_hidden_act", "relu2"), ("mamba_hidden_act", "silu")):
            if config.get(key, want) != want:
                raise ModelLoadError(f"{origin}: {key} {config[key]!r} is not supported (Nemotron-H uses {want!r})")
        heads = int(config.get("num_attention_heads", 32))
        kv_heads = int(config.get("num_key_value_heads") or heads)
        if heads % kv_heads:
            raise ModelLoadError(
                f"{origin}: num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
            )
        eps = float(config.get("layer_norm_epsilon", 1e-5))
        try:
            mamba = Mamba2Shape(
                num_heads=int(config.get("mamba_num_heads", 128)),
                head_dim=int(config.get("mamba_head_dim", 64)),
                n_groups=int(_aliased(config, "n_groups", "mamba_n_groups", 8)),
                state_size=int(config.get("ssm_state_size", 128)),
                conv_kernel=int(_aliased(config, "conv_kernel", "mamba_d_conv", 4)),
                chunk_size=int(_aliased(config, "chunk_size", "mamba_chunk_size", 128)),
                norm_eps=eps,
                **_time_step_limit(_aliased(config, "time_step_limit", "mamba_dt_limit", (0.0, math.inf)), origin),
            )
            moe = _moe_settings(config) if "moe" in kinds else None
        except ValueError as exc:
            raise ModelLoadError(f"{origin}: {exc}") from exc
        return cls(
            vocab_size=int(require(config, "vocab_size", origin)),
            hidden_size=int(require(config, "hidden_size", origin)),
            layer_kinds=kinds,
            norm_eps=eps,
            max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=int(config.get("head_dim") or config.get("attention_head_dim") or 128),
            intermediate_size=int(config.get("intermediate_size", 21504)),
            mlp_bias=bool(config.get("mlp_bias", False)),
            mamba=mamba,
            mamba_bias=bool(config.get("use_bias", False)),
            conv_bias=bool(_aliased(config, "use_conv_bias", "mamba_conv_bias", True)),
            moe=moe,
        )


def layer_kinds(config: dict[str, Any], origin: str) -> tuple[LayerKind, ...]:
    """One kind per layer, from ``layers_block_type`` (or its alias ``layer_types``), else from
    ``hybrid_override_pattern``."""
    listed = config.get("layers_block_type") or config.get("layer_types")
    if listed is not None:
        if not isinstance(listed, list) or not all(isinstance(name, str) for name in listed):
            raise ModelLoadError(f"{origin}: layers_block_type must be a list of layer type names, got {listed!r}")
        unknown = sorted({name for name in listed if name not in LIST_NAMES})
        if unknown:
            raise ModelLoadError(
                f"{origin}: unknown layer types {unknown} in layers_block_type (known: {sorted(LIST_NAMES)})"
            )
        kinds = tuple(LIST_NAMES[name] for name in listed)
    elif isinstance(config.get("hybrid_override_pattern"), str):
        pattern = config["hybrid_override_pattern"]
        unknown = sorted(set(pattern) - set(PATTERN_LETTERS))
        if unknown:
            raise ModelLoadError(
                f"{origin}: unknown letters {unknown} in hybrid_override_pattern {pattern!r} "
                "(M = Mamba-2, * = attention, - = MLP, E = MoE)"
            )
        kinds = tuple(PATTERN_LETTERS[letter] for letter in pattern)
    else:
        raise ModelLoadError(f"{origin}: a Nemotron-H config needs layers_block_type or hybrid_override_pattern")
    if not kinds:
        raise ModelLoadError(f"{origin}: the model has no layers (empty layers_block_type / hybrid_override_pattern)")
    return kinds


def _aliased(config: dict[str, Any], key: str, alias: str, default: Any) -> Any:
    """``config[alias]`` when present (the original NVIDIA name wins, as in transformers), else ``config[key]``."""
    if config.get(alias) is not None:
        return config[alias]
    return config[key] if config.get(key) is not None else default


def _number(value: Any) -> float:
    """A float from JSON, including transformers' ``{"__float__": "Infinity"}`` encoding and strings."""
    if isinstance(value, dict) and "__float__" in value:
        value = value["__float__"]
    return float(value)


def _time_step_limit(value: Any, origin: str) -> dict[str, float]:
    """``time_step_limit`` ``[min, max]`` -> ``{"dt_min": .., "dt_max": ..}`` (the clamp after softplus)."""
    try:
        low, high = (_number(v) for v in value)
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"{origin}: time_step_limit must be a pair [min, max] of numbers, got {value!r}") from exc
    if not 0.0 <= low <= high:
        raise ModelLoadError(f"{origin}: time_step_limit {value!r} must satisfy 0 <= min <= max")
    return {"dt_min": low, "dt_max": high}


def _moe_settings(config: dict[str, Any]) -> MoESettings:
    """Sigmoid routing with the selection-only correction bias, group-limited choice, optional
    renormalisation and routed scaling (DeepSeek-V3's router)."""
    router = RouterSpec(
        num_experts=int(_aliased(config, "n_routed_experts", "num_local_experts", 8)),
        top_k=int(config.get("num_experts_per_tok", 2)),
        scoring="sigmoid",
        normalize_top_k=bool(config.get("norm_topk_prob", True)),
        num_groups=int(config.get("n_group", 1)),
        top_k_groups=int(config.get("topk_group", 1)),
        routed_scaling_factor=float(config.get("routed_scaling_factor", 1.0)),
    )
    latent = config.get("moe_latent_size")
    return MoESettings(
        router=router,
        intermediate_size=int(config.get("moe_intermediate_size", 7688)),
        shared_intermediate_size=int(config.get("moe_shared_expert_intermediate_size", 7688)),
        latent_size=None if latent is None else int(latent),
    )
