"""Grouped-query attention over the paged KV cache: fused QKV, optional q/k/v norms, RoPE, optional
sliding window, output projection."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

from atlas_core.backends.base import Array, Backend
from atlas_core.batch.forward_batch import ForwardBatch
from atlas_core.batch.kv_cache import KVCache
from atlas_core.model.layers.norm import RMSNorm


@functools.cache
def fused_inputs_take_scales(backend_class: type[Backend]) -> bool:
    """Whether ``backend_class``'s `Backend.qk_norm_rope_write_kv` takes ``kv_scales`` (scaled caches): a backend
    written before that parameter overrides it without, and its scaled layers then take the separate ops."""
    return "kv_scales" in inspect.signature(backend_class.qk_norm_rope_write_kv).parameters


@dataclass
class AttentionWeights:
    """``qkv`` is ``[(Hq + 2 Hk) * D, H]`` (q rows, then k, then v), or ``[(Hq + Hk) * D, H]`` with
    ``values_from_keys`` (the values are the key projection's output, before ``k_norm`` and RoPE:
    Gemma 4's k = v attention); ``o`` is ``[H, Hq * D]``. ``v_norm`` normalises each value head
    (Gemma 4 uses one without a learned scale: weight of ones)."""

    qkv: Array
    o: Array
    qkv_bias: Array | None = None
    o_bias: Array | None = None
    q_norm: RMSNorm | None = None
    k_norm: RMSNorm | None = None
    v_norm: RMSNorm | None = None
    values_from_keys: bool = False


class Attention:
    """Self-attention of one layer; covers MHA and GQA, with RoPE from shared cos/sin tables.

    ``layer_index`` is the layer's slot in the `KVCache` (``kv.keys[layer_index]``). ``sliding_window``
    W limits each query to the W most recent keys, itself included (None: the whole context).
    """

    def __init__(
        self,
        backend: Backend,
        weights: AttentionWeights,
        *,
        layer_index: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        rope_cos: Array | None,
        rope_sin: Array | None,
        scale: float | None = None,
        sliding_window: int | None = None,
    ) -> None:
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be at least 1 (or None for none), got {sliding_window}")
        if weights.values_from_keys and weights.k_norm is None and weights.v_norm is None:
            raise ValueError("values_from_keys needs a k_norm or a v_norm (the values must not alias the rotated keys)")
        self.backend = backend
        self.weights = weights
        self.layer_index = layer_index
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.rope_cos, self.rope_sin = rope_cos, rope_sin
        self.scale = head_dim**-0.5 if scale is None else scale
        self.sliding_window = sliding_window

    def __call__(self, x: Array, batch: ForwardBatch, kv: KVCache) -> Array:
        backend, w = self.backend, self.weights
        tokens = x.shape[0]
        q_width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        qkv = backend.linear(x, w.qkv, w.qkv_bias)
        q = qkv[:, :q_width].reshape(tokens, self.num_heads, self.head_dim)
        k = qkv[:, q_width : q_width + kv_width].reshape(tokens, self.num_kv_heads, self.head_dim)
        v = k if w.values_from_keys else qkv[:, q_width + kv_width :].reshape(tokens, self.num_kv_heads, self.head_dim)
        k_cache, v_cache, scales = kv.keys[self.layer_index], kv.values[self.layer_index], kv.scales[self.layer_index]
        if self._fused_inputs() and (scales is None or fused_inputs_take_scales(type(backend))):
            norm = w.q_norm or w.k_norm
            eps = norm.eps if norm else 0.0
            positions, cos, sin = batch.rotary(self.rope_cos, self.rope_sin)
            q = backend.qk_norm_rope_write_kv(
                q,
                k,
                v,
                w.q_norm.weight if w.q_norm else None,
                w.k_norm.weight if w.k_norm else None,
                eps,
                positions,
                cos,
                sin,
                k_cache,
                v_cache,
                batch.attention.slot_mapping,
                **({} if scales is None else {"kv_scales": scales}),
            )
            return self.attend(q, batch, kv)
        if w.v_norm is not None:
            v = w.v_norm(v)[0]
        if w.q_norm is not None:
            q = w.q_norm(q)[0]
        if w.k_norm is not None:
            k = w.k_norm(k)[0]
        if self.rope_cos is not None:  # None: a layer without positional rotation (Nemotron-H attention)
            backend.rope(q, k, *batch.rotary(self.rope_cos, self.rope_sin))
        self.write_kv(k, v, batch, kv)
        return self.attend(q, batch, kv)

    def write_kv(self, k: Array, v: Array, batch: ForwardBatch, kv: KVCache) -> None:
        """Store this step's rotated keys and values in the layer's cache slot (`Backend.write_kv`, or
        `Backend.write_kv_scaled` with the slot's scales when it is stored scaled, fp8)."""
        k_cache, v_cache, scales = kv.keys[self.layer_index], kv.values[self.layer_index], kv.scales[self.layer_index]
        if scales is None:
            self.backend.write_kv(k_cache, v_cache, k, v, batch.attention.slot_mapping)
        else:
            self.backend.write_kv_scaled(k_cache, v_cache, k, v, batch.attention.slot_mapping, *scales)

    def mix(self, q: Array, batch: ForwardBatch, kv: KVCache) -> Array:
        """Paged attention of rotated queries ``q[T, Hq, D]`` over the layer's cache slot -> ``[T, Hq, D]``
        (`Backend.attention`, or `Backend.attention_scaled` when the slot is stored scaled, fp8)."""
        k_cache, v_cache, scales = kv.keys[self.layer_index], kv.values[self.layer_index], kv.scales[self.layer_index]
        if scales is None:
            return self.backend.attention(
                q, k_cache, v_cache, batch.attention, self.scale, sliding_window=self.sliding_window
            )
        return self.backend.attention_scaled(
            q, k_cache, v_cache, batch.attention, self.scale, *scales, sliding_window=self.sliding_window
        )

    def _fused_inputs(self) -> bool:
        """Whether `Backend.qk_norm_rope_write_kv` covers this layer: rotary positions, values of
        their own without a norm, and q/k norms (where present) plain `RMSNorm`s sharing one eps."""
        w = self.weights
        norms = [n for n in (w.q_norm, w.k_norm) if n is not None]
        plain = all(type(n) is RMSNorm for n in norms) and len({n.eps for n in norms}) <= 1
        return plain and self.rope_cos is not None and not w.values_from_keys and w.v_norm is None

    def attend(self, q: Array, batch: ForwardBatch, kv: KVCache) -> Array:
        """Attention of rotated queries ``q[T, Hq, D]`` over the layer's cache slot, then the output
        projection -> ``[T, H]``."""
        w = self.weights
        mixed = self.mix(q, batch, kv)
        return self.backend.linear(mixed.reshape(q.shape[0], self.num_heads * self.head_dim), w.o, w.o_bias)


class SharedKVAttention(Attention):
    """Attention that reuses the keys and values an earlier layer wrote this step (Gemma 4's KV-shared
    layers): it projects only queries (``weights.qkv`` is ``[Hq * D, H]``), writes nothing, and attends
    over cache slot ``layer_index``, the producing layer's."""

    def __call__(self, x: Array, batch: ForwardBatch, kv: KVCache) -> Array:
        backend, w = self.backend, self.weights
        q = backend.linear(x, w.qkv, w.qkv_bias).reshape(x.shape[0], self.num_heads, self.head_dim)
        if w.q_norm is not None:
            q = w.q_norm(q)[0]
        # rope rotates its q and k arguments alike: with no keys here, the query heads go in as both
        backend.rope(q[:, :1], q[:, 1:], *batch.rotary(self.rope_cos, self.rope_sin))
        return self.attend(q, batch, kv)
