"""Gemma 4's decoder layer: the sandwich layer, optionally with a parallel MoE branch, then the
per-layer-input gate and the layer scalar."""

from __future__ import annotations

from dataclasses import dataclass

from atlas_core.backends.base import Array, Backend
from atlas_core.batch.forward_batch import ForwardBatch
from atlas_core.batch.kv_cache import KVCache
from atlas_core.model.layers.moe import MoEFeedForward
from atlas_core.model.layers.norm import RMSNorm
from atlas_model_gemma.ops import GemmaOps
from atlas_model_gemma.per_layer_inputs import PerLayerInputGate
from atlas_model_gemma.sandwich import SandwichDecoderLayer


@dataclass
class ParallelMoEDecoderLayer(SandwichDecoderLayer):
    """Gemma 4 MoE: the feed-forward block is the dense MLP and the experts side by side::

        dense  = post_dense_norm(ffn(pre_ffn_norm(h)))
        routed = post_moe_norm(moe(pre_moe_norm(h), router_input=router_norm(h)))
        block  = dense + routed                       # then post_ffn_norm, as in every sandwich layer

    ``router_norm`` has no learned scale (weight of ones); the router's input scale and the per-expert
    scales are folded into ``moe``'s weights by the loader.
    """

    post_dense_norm: RMSNorm
    pre_moe_norm: RMSNorm
    router_norm: RMSNorm
    moe: MoEFeedForward
    post_moe_norm: RMSNorm

    def feed_forward(self, normed: Array, stream: Array) -> Array:
        dense = self.post_dense_norm(self.ffn(normed))[0]
        routed = self.moe(self.pre_moe_norm(stream)[0], router_input=self.router_norm(stream)[0])
        return self.moe.backend.ops(GemmaOps).add_scaled(dense, self.post_moe_norm(routed)[0])


@dataclass
class Gemma4DecoderLayer:
    """``out = (h + gate(h, per_layer_input)) * layer_scalar`` with ``h`` the sandwich layer's output
    (no gate term without per-layer inputs). A `DecoderLayer` that also takes the layer's per-layer
    input ``[T, P]`` (None without per-layer inputs); returns ``(out, None)``: the residual stream is
    materialised here."""

    backend: Backend
    block: SandwichDecoderLayer
    per_layer_gate: PerLayerInputGate | None
    layer_scalar: float

    def __call__(
        self,
        hidden: Array,
        residual: Array | None,
        batch: ForwardBatch,
        kv: KVCache,
        per_layer_input: Array | None = None,
    ) -> tuple[Array, None]:
        out, residual = self.block(hidden, residual, batch, kv)
        gemma = self.backend.ops(GemmaOps)
        if self.per_layer_gate is None:
            return gemma.add_scaled(out, residual, self.layer_scalar), None
        stream = gemma.add_scaled(out, residual)
        return gemma.add_scaled(stream, self.per_layer_gate(stream, per_layer_input), self.layer_scalar), None
