"""MiniMax-M2: attention with RMSNorm over all heads' q (and k) at once, partial rotary, and a sparse
MoE feed-forward in every layer (sigmoid routing with a selection-only ``e_score_correction_bias``,
renormalised top-k weights, experts named ``w1`` (gate) / ``w3`` (up) / ``w2`` (down))."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from atlas_core.backends.base import Array
from atlas_core.comm import CommBackend
from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.moe import (
    MINIMAX_EXPERT_NAMES,
    RouterSpec,
    config_num_experts,
    fused_expert_shapes,
    load_moe,
    router_spec_from_config,
)
from atlas_core.model.layers.norm import RMSNorm
from atlas_core.model.layers.parallel import ReducedMixer
from atlas_core.model.loader import DenseDecoderLoader
from atlas_core.model.rope import RopeSpec
from atlas_core.model.spec import DecoderSpec
from atlas_core.model.transformer import TransformerModel

MOE_PREFIX = "model.layers.{layer}.block_sparse_moe."
CORRECTION_BIAS = "e_score_correction_bias"


class AllHeadsRMSNorm:
    """RMSNorm over every head of a token together: ``x[T, heads, D]`` is normed as ``[T, heads * D]``
    with a ``[heads * D]`` weight, then given back per head (MiniMax-M2's ``q_norm`` / ``k_norm``)."""

    def __init__(self, norm: RMSNorm) -> None:
        self.norm = norm

    def __call__(self, x: Array, residual: Array | None = None) -> tuple[Array, Array]:
        if residual is not None:
            raise ValueError("AllHeadsRMSNorm normalises q or k alone; it takes no residual")
        normed, _ = self.norm(x.reshape(x.shape[0], -1))
        return normed.reshape(x.shape), x


class SplitAllHeadsRMSNorm:
    """`AllHeadsRMSNorm` of a tensor-parallel rank, which holds some heads: ``x[T, heads, D]`` of this rank's
    heads is normed with the root mean square over every rank's heads (an all-reduce of each token's sum of
    squares, in float32) and this rank's part of the weight. A key/value head replicated on several ranks
    is counted once per rank, in the sum and in the count alike, so the mean is the same."""

    def __init__(self, weight: Array, eps: float, comm: CommBackend, world: int) -> None:
        self.weight, self.eps, self.comm, self.world = weight, eps, comm, world

    def __call__(self, x: Array, residual: Array | None = None) -> tuple[Array, Array]:
        if residual is not None:
            raise ValueError("SplitAllHeadsRMSNorm normalises q or k alone; it takes no residual")
        flat = x.reshape(x.shape[0], -1).astype(np.float32)
        total = self.comm.all_reduce((flat * flat).sum(axis=-1, keepdims=True))
        normed = flat / np.sqrt(total / (flat.shape[1] * self.world) + self.eps) * self.weight
        return normed.astype(x.dtype).reshape(x.shape), x


class MiniMaxM2Loader(DenseDecoderLoader):
    """``minimax_m2``: the dense decoder with a MoE feed-forward in every layer (`feed_forward`) and
    q/k norms over all heads at once (`AllHeadsRMSNorm`, put in place after `build`)."""

    spec_overrides = {"qk_norm": True}

    @property
    def config(self) -> dict[str, Any]:
        """The checkpoint's config.json."""
        return self.source.config

    def spec(self) -> DecoderSpec:
        origin = f"{self.origin}/config.json"
        config = self.config
        unsupported = {
            "scoring_func": (config.get("scoring_func", "sigmoid"), "sigmoid"),
            "use_qk_norm": (config.get("use_qk_norm", True), True),
            "qk_norm_type": (config.get("qk_norm_type", "per_layer"), "per_layer"),
            "shared_intermediate_size": (config.get("shared_intermediate_size") or 0, 0),
        }
        for key, (value, supported) in unsupported.items():
            if value != supported:
                raise ModelLoadError(
                    f"{origin}: {key} = {value!r} is not supported for minimax_m2 (only {supported!r})"
                )
        spec = super().spec()
        return dataclasses.replace(spec, rope=self.rope(spec.head_dim))

    def rope(self, head_dim: int) -> RopeSpec:
        """RoPE over ``rotary_dim`` of each head: released MiniMax-M2 configs give the legacy
        ``rotary_dim`` key instead of ``partial_rotary_factor`` (which wins when both are present)."""
        config = dict(self.config)
        params = config.get("rope_parameters") or {}
        rotary_dim = config.get("rotary_dim")
        if rotary_dim is not None and "partial_rotary_factor" not in params and "partial_rotary_factor" not in config:
            config["partial_rotary_factor"] = int(rotary_dim) / head_dim
        return RopeSpec.from_config(config, head_dim)

    @classmethod
    def checkpoint_shapes(cls, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """The dense decoder's tensors with q/k norms over all heads and, in place of each MLP, the
        router, its correction bias (unless ``use_routing_bias`` is false) and the routed experts
        (described fused, which `read_experts` reads like the per-expert ``w1/w3/w2``)."""
        shapes = super().checkpoint_shapes(config)
        spec = DecoderSpec.from_config(config, **cls.spec_overrides)
        experts, hidden = config_num_experts(config), spec.hidden_size
        for layer in range(spec.num_layers):
            a, moe = f"model.layers.{layer}.self_attn.", MOE_PREFIX.format(layer=layer)
            shapes[a + "q_norm.weight"] = (spec.num_heads * spec.head_dim,)
            shapes[a + "k_norm.weight"] = (spec.num_kv_heads * spec.head_dim,)
            for name in ("gate_proj", "up_proj", "down_proj"):
                del shapes[f"model.layers.{layer}.mlp.{name}.weight"]
            shapes[moe + "gate.weight"] = (experts, hidden)
            shapes |= fused_expert_shapes(moe + "experts.", experts, spec.intermediate_size, hidden)
            if config.get("use_routing_bias", True):
                shapes[moe + CORRECTION_BIAS] = (experts,)
        return shapes

    def router_spec(self) -> RouterSpec:
        """Sigmoid scores, top ``num_experts_per_tok`` renormalised."""
        return router_spec_from_config(
            self.config, f"{self.origin}/config.json", scoring="sigmoid", normalize_top_k=True
        )

    def feed_forward(self, spec: DecoderSpec, layer: int) -> Callable[[Array], Array]:
        prefix = MOE_PREFIX.format(layer=layer)
        has_bias = prefix + CORRECTION_BIAS in self.source
        if not has_bias and self.config.get("use_routing_bias", True):
            raise ModelLoadError(
                f"{self.origin}: weight {prefix + CORRECTION_BIAS!r} is missing from the checkpoint "
                "(set use_routing_bias to false in config.json if the model routes without one)"
            )
        return load_moe(
            self,
            prefix,
            self.router_spec(),
            names=MINIMAX_EXPERT_NAMES,
            correction_bias=CORRECTION_BIAS if has_bias else None,
        )

    def build(self) -> TransformerModel:
        model = super().build()
        spec = self.spec()
        heads = self.shard.split(spec.num_heads, "num_attention_heads")
        kv_heads = self.shard.kv_heads(spec.num_kv_heads, spec.num_heads)
        for i, layer in enumerate(model.layers):
            block: Any = layer  # the base loader's `pre_norm_decoder_layer`: its mixer holds AttentionWeights
            attention: Any = block.mixer.mixer if isinstance(block.mixer, ReducedMixer) else block.mixer
            weights = attention.weights
            if self.parallel is None or not self.shard.tensor_split:
                weights.q_norm, weights.k_norm = AllHeadsRMSNorm(weights.q_norm), AllHeadsRMSNorm(weights.k_norm)
                continue
            a, world = f"model.layers.{i}.self_attn.", self.shard.tensor_parallel_size
            for kind, rows in (("q", heads), ("k", kv_heads)):
                part = self.float_part(
                    f"{a}{kind}_norm.weight", range(rows.start * spec.head_dim, rows.stop * spec.head_dim)
                )
                norm = SplitAllHeadsRMSNorm(self.upload_float32(part), spec.rms_norm_eps, self.parallel.comm, world)
                setattr(weights, f"{kind}_norm", norm)
        return model
