"""Grouped-query attention over the paged KV cache: fused QKV, optional q/k norm, RoPE, output projection."""

from __future__ import annotations

from dataclasses import dataclass

from atlas_core.backends.base import Array, Backend
from atlas_core.engine.forward_batch import ForwardBatch
from atlas_core.engine.kv_cache import KVCache
from atlas_core.model.layers.norm import RMSNorm


@dataclass
class AttentionWeights:
    """``qkv`` is ``[(Hq + 2 Hk) * D, H]`` (q rows, then k, then v); ``o`` is ``[H, Hq * D]``."""

    qkv: Array
    o: Array
    qkv_bias: Array | None = None
    o_bias: Array | None = None
    q_norm: RMSNorm | None = None
    k_norm: RMSNorm | None = None


class Attention:
    """Self-attention of one layer; covers MHA and GQA, with RoPE from shared cos/sin tables."""

    def __init__(
        self, backend: Backend, weights: AttentionWeights, *, layer_index: int, num_heads: int,
        num_kv_heads: int, head_dim: int, rope_cos: Array, rope_sin: Array, scale: float | None = None,
    ) -> None:
        self.backend = backend
        self.weights = weights
        self.layer_index = layer_index
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.rope_cos, self.rope_sin = rope_cos, rope_sin
        self.scale = head_dim**-0.5 if scale is None else scale

    def __call__(self, x: Array, batch: ForwardBatch, kv: KVCache) -> Array:
        backend, w = self.backend, self.weights
        tokens = x.shape[0]
        q_width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        qkv = backend.linear(x, w.qkv, w.qkv_bias)
        q = qkv[:, :q_width].reshape(tokens, self.num_heads, self.head_dim)
        k = qkv[:, q_width : q_width + kv_width].reshape(tokens, self.num_kv_heads, self.head_dim)
        v = qkv[:, q_width + kv_width :].reshape(tokens, self.num_kv_heads, self.head_dim)
        if w.q_norm is not None:
            q = w.q_norm(q)[0]
        if w.k_norm is not None:
            k = w.k_norm(k)[0]
        backend.rope(q, k, batch.positions, self.rope_cos, self.rope_sin)
        k_cache, v_cache = kv.keys[self.layer_index], kv.values[self.layer_index]
        backend.write_kv(k_cache, v_cache, k, v, batch.attention.slot_mapping)
        mixed = backend.attention(q, k_cache, v_cache, batch.attention, self.scale)
        return backend.linear(mixed.reshape(tokens, q_width), w.o, w.o_bias)
