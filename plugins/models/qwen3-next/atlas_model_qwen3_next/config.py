"""`HybridSpec`: what a Qwen3-Next / Qwen3.5 config says about the layer stack.

Vision-language configs (``qwen3_5``, ``qwen3_5_moe``) keep the text model's keys under ``text_config``;
text-only configs have them at the top level. Older Qwen3-Next configs write ``full_attention_interval``
instead of ``layer_types`` and ``partial_rotary_factor`` / ``rope_theta`` at the top level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.gated_delta_net import GatedDeltaNetShape
from atlas_core.model.spec import DecoderSpec, require

LINEAR_ATTENTION, FULL_ATTENTION = "linear_attention", "full_attention"


@dataclass(frozen=True)
class MoESpec:
    """The sparse MoE blocks: softmax top-k routing and one sigmoid-gated shared expert per block."""

    num_experts: int
    top_k: int
    intermediate_size: int
    shared_expert_intermediate_size: int
    normalize_top_k: bool


@dataclass(frozen=True)
class HybridSpec:
    """The decoder's common shape, each layer's mixer type, the GDN shape, and which layers are MoE."""

    decoder: DecoderSpec
    layer_types: tuple[str, ...]
    gdn: GatedDeltaNetShape
    moe: MoESpec | None
    moe_layers: frozenset[int]

    @classmethod
    def from_config(cls, config: dict[str, Any], origin: str) -> HybridSpec:
        """Parse ``config`` (the whole ``config.json``); errors name ``origin`` and the key."""
        text = config.get("text_config") or config
        if text is not config:
            origin = f"{origin} (text_config)"
            if "tie_word_embeddings" not in text:  # vision-language configs may keep it at the top level only
                text = {**text, "tie_word_embeddings": config.get("tie_word_embeddings", False)}
        moe_only = "intermediate_size" not in text  # qwen3_5_moe: every layer is MoE, no dense MLP size
        decoder = DecoderSpec.from_config({"intermediate_size": 0, **text} if moe_only else text, origin)
        layer_types = cls._layer_types(text, decoder.num_layers, origin)
        try:
            gdn = GatedDeltaNetShape(
                num_key_heads=int(require(text, "linear_num_key_heads", origin)),
                num_value_heads=int(require(text, "linear_num_value_heads", origin)),
                key_head_dim=int(require(text, "linear_key_head_dim", origin)),
                value_head_dim=int(require(text, "linear_value_head_dim", origin)),
                conv_kernel=int(text.get("linear_conv_kernel_dim", 4)),
                norm_eps=decoder.rms_norm_eps,
            )
        except ValueError as exc:
            raise ModelLoadError(f"{origin}: {exc}") from exc
        moe, moe_layers = cls._moe(text, decoder.num_layers, origin)
        if moe_only and len(moe_layers) != decoder.num_layers:
            raise ModelLoadError(f"{origin}: 'intermediate_size' is missing but not every layer is a MoE layer")
        return cls(decoder=decoder, layer_types=layer_types, gdn=gdn, moe=moe, moe_layers=moe_layers)

    @staticmethod
    def _layer_types(text: dict[str, Any], num_layers: int, origin: str) -> tuple[str, ...]:
        types = text.get("layer_types")
        if types is None:
            interval = int(text.get("full_attention_interval", 4))
            types = [FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(num_layers)]
        if len(types) != num_layers:
            raise ModelLoadError(
                f"{origin}: 'layer_types' lists {len(types)} layers, num_hidden_layers is {num_layers}"
            )
        unknown = sorted(set(types) - {LINEAR_ATTENTION, FULL_ATTENTION})
        if unknown:
            raise ModelLoadError(
                f"{origin}: layer_types {unknown} are not supported "
                f"(expected {LINEAR_ATTENTION!r} or {FULL_ATTENTION!r})"
            )
        return tuple(types)

    @staticmethod
    def _moe(text: dict[str, Any], num_layers: int, origin: str) -> tuple[MoESpec | None, frozenset[int]]:
        num_experts = int(text.get("num_experts") or 0)
        if num_experts == 0:
            return None, frozenset()
        spec = MoESpec(
            num_experts=num_experts,
            top_k=int(require(text, "num_experts_per_tok", origin)),
            intermediate_size=int(require(text, "moe_intermediate_size", origin)),
            shared_expert_intermediate_size=int(require(text, "shared_expert_intermediate_size", origin)),
            normalize_top_k=bool(text.get("norm_topk_prob", True)),
        )
        dense_only = set(text.get("mlp_only_layers") or [])
        step = int(text.get("decoder_sparse_step", 1))
        layers = frozenset(i for i in range(num_layers) if i not in dense_only and (i + 1) % step == 0)
        return spec, layers
