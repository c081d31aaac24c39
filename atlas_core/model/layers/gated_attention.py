"""Gated attention (Qwen3-Next, Qwen3.5): grouped-query attention whose output is gated per channel
before the output projection, ``o_proj(attention(q, k, v) * sigmoid(gate))``."""

from __future__ import annotations

from atlas_core.backends.base import Array
from atlas_core.batch.forward_batch import ForwardBatch
from atlas_core.batch.kv_cache import KVCache
from atlas_core.model.layers.attention import Attention


class GatedAttention(Attention):
    """`Attention` with an output gate. ``weights.qkv`` is ``[(2 Hq + 2 Hk) * D, H]``: the q rows, k rows,
    v rows, then the gate rows (one per query channel); q/k norms, RoPE (partial rotary through the
    cos/sin tables' width), the paged cache and GQA are as in `Attention`."""

    def __call__(self, x: Array, batch: ForwardBatch, kv: KVCache) -> Array:
        backend, w = self.backend, self.weights
        tokens = x.shape[0]
        q_width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        v_end = q_width + 2 * kv_width
        projected = backend.linear(x, w.qkv, w.qkv_bias)
        q = projected[:, :q_width].reshape(tokens, self.num_heads, self.head_dim)
        k = projected[:, q_width : q_width + kv_width].reshape(tokens, self.num_kv_heads, self.head_dim)
        v = projected[:, q_width + kv_width : v_end].reshape(tokens, self.num_kv_heads, self.head_dim)
        if w.q_norm is not None:
            q = w.q_norm(q)[0]
        if w.k_norm is not None:
            k = w.k_norm(k)[0]
        backend.rope(q, k, *batch.rotary(self.rope_cos, self.rope_sin))
        self.write_kv(k, v, batch, kv)
        mixed = self.mix(q, batch, kv).reshape(tokens, q_width)
        return backend.linear(backend.sigmoid_gate(mixed, projected[:, v_end:]), w.o, w.o_bias)
