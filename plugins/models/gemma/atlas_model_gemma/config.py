"""Gemma 3 / Gemma 4 configs -> `GemmaSpec`: per-layer attention type, window, RoPE, head shape, KV source.

Reads both what transformers 5 writes (``rope_parameters`` keyed by layer type, Gemma 4's
``per_layer_config``) and the Hub's older keys (``rope_theta`` / ``rope_local_base_freq`` /
``rope_scaling`` / ``sliding_window_pattern``; ``global_head_dim`` / ``num_global_key_value_heads``).
Keys a config leaves out take the transformers defaults (the Hub's Gemma 3 vision-language configs
list only a few text keys). Vision-language checkpoints (``model_type`` ``gemma3`` / ``gemma4``)
keep the text config under ``text_config``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from atlas_core.backends.ops.moe import RouterSpec
from atlas_core.errors import ModelLoadError
from atlas_core.model.rope import RopeSpec

Family = Literal["gemma3", "gemma4"]
SLIDING, FULL = "sliding_attention", "full_attention"
GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")

_COMMON_DEFAULTS: dict[str, Any] = {
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "final_logit_softcapping": None,
    "tie_word_embeddings": True,
}
DEFAULTS: dict[Family, dict[str, Any]] = {
    "gemma3": _COMMON_DEFAULTS
    | {
        "vocab_size": 262_208,
        "num_hidden_layers": 26,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "use_bidirectional_attention": False,
    },
    "gemma4": _COMMON_DEFAULTS
    | {
        "vocab_size": 262_144,
        "num_hidden_layers": 30,
        "sliding_window": 512,
        "use_bidirectional_attention": None,
        "vocab_size_per_layer_input": 262_144,
        "hidden_size_per_layer_input": 256,
        "attention_k_eq_v": False,
        "num_kv_shared_layers": 0,
        "enable_moe_block": False,
        "global_head_dim": 512,
        "num_global_key_value_heads": None,
    },
}
_ROPE_THETA = {SLIDING: 10_000.0, FULL: 1_000_000.0}
_GEMMA4_ROPE = {
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
    FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}


@dataclass(frozen=True)
class GemmaLayerSpec:
    """One decoder layer's attention: its type, window (None: full), head shape, RoPE, and the layer
    whose KV it attends over (``kv_source`` = itself, or an earlier layer for Gemma 4's KV sharing)."""

    layer_type: str
    sliding_window: int | None
    head_dim: int
    num_kv_heads: int
    rope: RopeSpec
    kv_source: int


@dataclass(frozen=True)
class GemmaSpec:
    """Everything the Gemma loaders need from a config (``text`` is the text config, defaults filled in)."""

    family: Family
    text: dict[str, Any]
    layers: tuple[GemmaLayerSpec, ...]
    tie_word_embeddings: bool
    attention_scale: float
    router: RouterSpec | None
    final_logit_softcapping: float | None

    def __getitem__(self, key: str) -> Any:
        return self.text[key]

    @property
    def per_layer_input_size(self) -> int:
        """Gemma 4's per-layer embedding width (0: none)."""
        return int(self.text.get("hidden_size_per_layer_input") or 0)


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's config: ``text_config`` of a vision-language config, else the config itself."""
    return dict(config["text_config"]) if isinstance(config.get("text_config"), dict) else dict(config)


def parse(config: dict[str, Any], family: Family, origin: str) -> GemmaSpec:
    """`GemmaSpec` of a Gemma 3 or Gemma 4 config (text-only or vision-language)."""
    text = DEFAULTS[family] | {k: v for k, v in text_config(config).items() if v is not None}
    if text.get("hidden_activation") not in GELU_TANH:
        raise ModelLoadError(
            f"{origin}: hidden_activation {text.get('hidden_activation')!r} is not supported "
            "(Gemma uses 'gelu_pytorch_tanh')"
        )
    bidirectional = text.get("use_bidirectional_attention")
    if bidirectional is True or bidirectional == "all":
        raise ModelLoadError(
            f"{origin}: use_bidirectional_attention={bidirectional!r} makes an encoder (embedding model); "
            "Atlas serves causal decoders only"
        )
    num_layers = int(text["num_hidden_layers"])
    types = _layer_types(text, family, num_layers, origin)
    tie = bool(config.get("tie_word_embeddings", text["tie_word_embeddings"]))
    # transformers' Gemma3ForConditionalGeneration never soft-caps its logits, whatever text_config says
    multimodal_gemma3 = family == "gemma3" and "text_config" in config
    soft_cap = None if multimodal_gemma3 else text["final_logit_softcapping"]
    if family == "gemma3":
        layers = _gemma3_layers(text, types)
        scale, router = float(text["query_pre_attn_scalar"]) ** -0.5, None
    else:
        layers = _gemma4_layers(text, types, origin)
        scale, router = 1.0, _gemma4_router(text, origin)
    return GemmaSpec(family, text, layers, tie, scale, router, soft_cap)


def _layer_types(text: dict[str, Any], family: Family, num_layers: int, origin: str) -> list[str]:
    types = text.get("layer_types")
    if types is None:
        pattern = int(text.get("sliding_window_pattern") or 6)
        types = [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
    types = list(types)
    if len(types) != num_layers or set(types) - {SLIDING, FULL}:
        raise ModelLoadError(
            f"{origin}: layer_types must list {num_layers} entries of {SLIDING!r} / {FULL!r}, got {types}"
        )
    if family == "gemma4":
        types[-1] = FULL  # transformers forces Gemma 4's last layer to full attention
    return types


def _rope(params: dict[str, Any], head_dim: int, max_positions: int) -> RopeSpec:
    return RopeSpec.from_config({"rope_parameters": params, "max_position_embeddings": max_positions}, head_dim)


def _gemma3_rope_parameters(text: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per-type RoPE parameters, as transformers' ``Gemma3TextConfig.convert_rope_params_to_dict``."""
    given = text.get("rope_parameters") or {}
    given = given if SLIDING in given or FULL in given else {}
    full = dict(given.get(FULL) or {"rope_type": "default"})
    full.update(text.get("rope_scaling") or {})
    full.setdefault("rope_theta", text.get("rope_theta", _ROPE_THETA[FULL]))
    sliding = dict(given.get(SLIDING) or {"rope_type": "default"})
    sliding.setdefault("rope_theta", text.get("rope_local_base_freq", _ROPE_THETA[SLIDING]))
    return {FULL: full, SLIDING: sliding}


def _gemma3_layers(text: dict[str, Any], types: list[str]) -> tuple[GemmaLayerSpec, ...]:
    head_dim, max_positions = int(text["head_dim"]), int(text["max_position_embeddings"])
    rope = {t: _rope(p, head_dim, max_positions) for t, p in _gemma3_rope_parameters(text).items()}
    window = int(text["sliding_window"])
    return tuple(
        GemmaLayerSpec(t, window if t == SLIDING else None, head_dim, int(text["num_key_value_heads"]), rope[t], i)
        for i, t in enumerate(types)
    )


def _gemma4_overrides(text: dict[str, Any], types: list[str], origin: str) -> dict[int, dict[str, Any]]:
    """Per-layer ``head_dim`` / ``num_key_value_heads`` overrides (transformers' ``per_layer_config``)."""
    given = text.get("per_layer_config")
    if given is None:
        override: dict[str, Any] = {"head_dim": text["global_head_dim"]}
        if text["attention_k_eq_v"] and text.get("num_global_key_value_heads") is not None:
            override["num_key_value_heads"] = text["num_global_key_value_heads"]
        return {i: override for i, t in enumerate(types) if t == FULL}
    overrides = {int(k): dict(v) for k, v in given.items()}
    for layer, values in overrides.items():
        unknown = set(values) - {"head_dim", "num_key_value_heads"}
        if unknown or not 0 <= layer < len(types):
            raise ModelLoadError(
                f"{origin}: per_layer_config[{layer}] overrides {sorted(values)}; only head_dim and "
                f"num_key_value_heads of layers 0..{len(types) - 1} are supported"
            )
    return overrides


def _kv_sources(text: dict[str, Any], types: list[str], origin: str) -> list[int]:
    """For each layer, the layer whose KV it attends over: itself, or (for the last
    ``num_kv_shared_layers`` layers) the last earlier non-shared layer of its type."""
    first_shared = len(types) - int(text["num_kv_shared_layers"])
    if not 0 < first_shared <= len(types):
        raise ModelLoadError(
            f"{origin}: num_kv_shared_layers={text['num_kv_shared_layers']} must be below num_hidden_layers"
        )
    sources = list(range(len(types)))
    for i in range(first_shared, len(types)):
        producers = [j for j in range(first_shared) if types[j] == types[i]]
        if not producers:
            raise ModelLoadError(
                f"{origin}: KV-shared layer {i} ({types[i]}) has no earlier {types[i]} layer to share with"
            )
        sources[i] = producers[-1]
    return sources


def _gemma4_layers(text: dict[str, Any], types: list[str], origin: str) -> tuple[GemmaLayerSpec, ...]:
    params = {t: dict(p) for t, p in (text.get("rope_parameters") or _GEMMA4_ROPE).items()}
    for t in (SLIDING, FULL):
        params.setdefault(t, dict(_GEMMA4_ROPE[t])).setdefault("rope_theta", _ROPE_THETA[t])
    overrides = _gemma4_overrides(text, types, origin)
    window, max_positions = int(text["sliding_window"]), int(text["max_position_embeddings"])
    sources = _kv_sources(text, types, origin)
    layers = []
    for i, t in enumerate(types):
        shape = {"head_dim": text["head_dim"], "num_key_value_heads": text["num_key_value_heads"]}
        shape |= overrides.get(i, {})
        head_dim = int(shape["head_dim"])
        layers.append(
            GemmaLayerSpec(
                t,
                window if t == SLIDING else None,
                head_dim,
                int(shape["num_key_value_heads"]),
                _rope(params[t], head_dim, max_positions),
                sources[i],
            )
        )
    for i, layer in enumerate(layers):
        source = layers[layer.kv_source]
        if (layer.head_dim, layer.num_kv_heads) != (source.head_dim, source.num_kv_heads):
            raise ModelLoadError(
                f"{origin}: layer {i} shares the KV of layer {layer.kv_source} but their heads differ "
                f"(head_dim {layer.head_dim} vs {source.head_dim}, "
                f"kv heads {layer.num_kv_heads} vs {source.num_kv_heads})"
            )
    return tuple(layers)


def _gemma4_router(text: dict[str, Any], origin: str) -> RouterSpec | None:
    if not text.get("enable_moe_block"):
        return None
    experts, top_k = text.get("num_experts"), text.get("top_k_experts")
    if not experts or not top_k or not text.get("moe_intermediate_size"):
        raise ModelLoadError(f"{origin}: enable_moe_block needs num_experts, top_k_experts and moe_intermediate_size")
    return RouterSpec(num_experts=int(experts), top_k=int(top_k), scoring="softmax", normalize_top_k=True)
