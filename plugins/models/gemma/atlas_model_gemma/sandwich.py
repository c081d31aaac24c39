"""Decoder layer with norms on both sides of each sub-block (Gemma 2/3/4's "sandwich" layout)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from atlas_core.backends.base import Array
from atlas_core.batch.forward_batch import ForwardBatch
from atlas_core.batch.kv_cache import KVCache
from atlas_core.model.layers.norm import RMSNorm
from atlas_core.model.transformer import Mixer


@dataclass
class SandwichDecoderLayer:
    """``h = x + post_mixer_norm(mixer(input_norm(x)))``; ``out = h + post_ffn_norm(ffn(pre_ffn_norm(h)))``.

    Like `PreNormDecoderLayer` it takes and returns ``(hidden, residual)`` with the residual adds fused
    into the next norm: the layer's output is ``hidden + residual`` (``residual`` None: ``hidden``).
    Subclasses with a feed-forward block that also reads the residual stream (Gemma 4's experts route
    on it) override `feed_forward`.
    """

    input_norm: RMSNorm
    mixer: Mixer
    post_mixer_norm: RMSNorm
    pre_ffn_norm: RMSNorm
    ffn: Callable[[Array], Array]
    post_ffn_norm: RMSNorm

    def __call__(self, hidden: Array, residual: Array | None, batch: ForwardBatch, kv: KVCache) -> tuple[Array, Array]:
        normed, residual = self.input_norm(hidden, residual)
        mixed = self.post_mixer_norm(self.mixer(normed, batch, kv))[0]
        normed, residual = self.pre_ffn_norm(mixed, residual)
        return self.post_ffn_norm(self.feed_forward(normed, residual))[0], residual

    def feed_forward(self, normed: Array, stream: Array) -> Array:
        """The block between ``pre_ffn_norm`` and ``post_ffn_norm``: ``ffn(normed)``. ``stream`` is the
        residual stream ``h`` the block's output is added to (unused here)."""
        return self.ffn(normed)
