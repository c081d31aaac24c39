"""Qwen3-MoE: Qwen3 attention (per-head q/k norms) with sparse MoE feed-forward layers.

A layer is sparse when ``num_experts`` (saved as ``num_local_experts`` by transformers 5) is above
0, the layer is not listed in ``mlp_only_layers`` and ``(layer + 1) % decoder_sparse_step == 0``;
other layers keep a dense SwiGLU MLP of ``intermediate_size``. Routing: softmax over the experts,
top ``num_experts_per_tok``, renormalised when ``norm_topk_prob``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from atlas_core.backends.base import Array
from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.moe import RouterSpec, load_moe, router_spec_from_config
from atlas_core.model.loader import DenseDecoderLoader
from atlas_core.model.sparse_layers import qwen_sparse_layer, with_sparse_mlp_shapes
from atlas_core.model.spec import DecoderSpec


class Qwen3MoeLoader(DenseDecoderLoader):
    """``qwen3_moe``: Qwen3's dense decoder whose sparse layers (`is_sparse`) have a MoE feed-forward."""

    spec_overrides = {"qk_norm": True}

    @property
    def config(self) -> dict[str, Any]:
        """The checkpoint's config.json."""
        return self.source.config

    def spec(self) -> DecoderSpec:
        if self.config.get("use_sliding_window"):
            raise ModelLoadError(
                f"{self.origin}/config.json: use_sliding_window is true; Qwen3-MoE with sliding-window attention "
                "is not supported (set it to false to run with full attention)"
            )
        return super().spec()

    def router_spec(self) -> RouterSpec:
        """Softmax over the experts, top ``num_experts_per_tok``, renormalised when ``norm_topk_prob``."""
        return router_spec_from_config(
            self.config,
            f"{self.origin}/config.json",
            scoring="softmax",
            normalize_top_k=bool(self.config.get("norm_topk_prob", False)),
        )

    def is_sparse(self, layer: int) -> bool:
        """Whether ``layer`` has experts (the rule of transformers' ``Qwen3MoeDecoderLayer``)."""
        return qwen_sparse_layer(self.config, layer)

    @classmethod
    def checkpoint_shapes(cls, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """The dense decoder's tensors, with each sparse layer's MLP replaced by its router and fused experts."""
        return with_sparse_mlp_shapes(super().checkpoint_shapes(config), config)

    def feed_forward(self, spec: DecoderSpec, layer: int) -> Callable[[Array], Array]:
        if not self.is_sparse(layer):
            return super().feed_forward(spec, layer)
        return load_moe(self, f"model.layers.{layer}.mlp.", self.router_spec())
