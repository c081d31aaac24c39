"""The cuda backend's attention-input ops (`CudaBackend.rope`, `write_kv`, `write_kv_scaled`,
`qk_norm_rope_write_kv`): each one kernel of ``kernels/attention_inputs.cu`` over strided per-head views, rows
independent. The KV writes store bf16 caches, or fp8 (E4M3 byte) caches given the layer's scales."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from atlas_core.backends.base import Array, Backend
from atlas_gb10.arrays import BF16, cache_kind, element_strides, null_or

if TYPE_CHECKING:
    from atlas_gb10.backend import CudaBackend

QKV_FUSED_WARPS, QKV_FUSED_MAX_HEAD_DIM, QKV_FUSED_BATCH = 4, 256, 4
"""``QKR_WARPS``, ``QKR_MAX_D`` and ``QKR_BATCH`` of ``attention_inputs.cu``'s fused attention-input kernels."""
QKV_ROTATED_WIDTHS = (64, 128, 256)
"""Head widths with a kernel of their own when all of a head is rotated (``_d64`` ...: `QKV_FUSED_BATCH` heads a
warp, in registers), taken where its grid still gives every SM a block (`batches_heads`)."""


def batches_heads(tokens: int, heads: int, d: int, half: int, sm_count: int) -> bool:
    """Whether `qk_norm_rope_write_kv` takes a ``_d{d}`` kernel (`QKV_FUSED_BATCH` heads a warp): all of a head is
    rotated, ``d`` is one of `QKV_ROTATED_WIDTHS`, and its blocks of `QKV_FUSED_WARPS` warps still number at least
    ``sm_count``. Decode steps of a few tokens keep one head a warp: more warps issue their reads at once there."""
    blocks = tokens * math.ceil(heads / (QKV_FUSED_WARPS * QKV_FUSED_BATCH))
    return 2 * half == d and d in QKV_ROTATED_WIDTHS and blocks >= sm_count


def rope(backend: CudaBackend, q: Array, k: Array, positions: Array, cos: Array, sin: Array) -> None:
    backend.require_bf16("rope", q, k)
    if q.strides[-1] != q.itemsize or k.strides[-1] != k.itemsize:
        raise ValueError("cuda backend: rope needs q and k with contiguous head dims")
    tokens, half = q.shape[0], cos.shape[1]
    if tokens == 0 or half == 0:
        return
    if cos.dtype != np.float32:  # the contract's tables are float32; accept others at the cost of a copy
        cos, sin = cos.astype(np.float32), sin.astype(np.float32)
    qs, ks = element_strides(q), element_strides(k)
    threads = min(1024, 32 * math.ceil((q.shape[1] + k.shape[1]) * half / 32))
    backend._kernel("attention_inputs", "rope_bf16")(
        (tokens,),
        (threads,),
        (
            q,
            np.int64(qs[0]),
            np.int64(qs[1]),
            np.int32(q.shape[1]),
            k,
            np.int64(ks[0]),
            np.int64(ks[1]),
            np.int32(k.shape[1]),
            positions,
            cos,
            sin,
            np.int32(half),
        ),
    )


def write_kv(
    backend: CudaBackend,
    k_cache: Array,
    v_cache: Array,
    k: Array,
    v: Array,
    slot_mapping: Array,
    kv_scales: tuple[float, float] | None = None,
) -> None:
    """`Backend.write_kv` (``kv_scales`` None) or `Backend.write_kv_scaled` (fp8 caches, their scales)."""
    backend.require_bf16("write_kv", k, v)
    dtype = cache_kind("write_kv", k_cache, v_cache, kv_scales)
    k_scale, v_scale = kv_scales or (1.0, 1.0)
    k, v = backend.contiguous_rows(k), backend.contiguous_rows(v)
    tokens, heads, d = k.shape
    if tokens == 0:
        return
    ks, vs = element_strides(k), element_strides(v)
    threads = min(1024, 32 * math.ceil(heads * d / 32))
    backend._kernel("attention_inputs", f"write_kv_{dtype}")(
        (tokens,),
        (threads,),
        (
            k_cache,
            v_cache,
            k,
            np.int64(ks[0]),
            np.int64(ks[1]),
            v,
            np.int64(vs[0]),
            np.int64(vs[1]),
            slot_mapping,
            np.int32(heads),
            np.int32(d),
            np.float32(k_scale),
            np.float32(v_scale),
        ),
    )


def qk_norm_rope_write_kv(
    backend: CudaBackend,
    q: Array,
    k: Array,
    v: Array,
    q_norm_weight: Array | None,
    k_norm_weight: Array | None,
    eps: float,
    positions: Array,
    cos: Array,
    sin: Array,
    k_cache: Array,
    v_cache: Array,
    slot_mapping: Array,
    kv_scales: tuple[float, float] | None = None,
) -> Array:
    """One kernel for the per-head norms, RoPE and the KV write (heads up to ``QKV_FUSED_MAX_HEAD_DIM``
    wide; wider heads take the composed ops); fp8 caches given ``kv_scales``."""
    backend.require_bf16("qk_norm_rope_write_kv", q, k, v, q_norm_weight, k_norm_weight)
    dtype = cache_kind("qk_norm_rope_write_kv", k_cache, v_cache, kv_scales)
    k_scale, v_scale = kv_scales or (1.0, 1.0)
    tokens, q_heads, d = q.shape
    kv_heads, half = k.shape[1], cos.shape[1]
    if d > QKV_FUSED_MAX_HEAD_DIM or any(a.strides[-1] != a.itemsize for a in (q, k, v)):
        return Backend.qk_norm_rope_write_kv(
            backend,
            q,
            k,
            v,
            q_norm_weight,
            k_norm_weight,
            eps,
            positions,
            cos,
            sin,
            k_cache,
            v_cache,
            slot_mapping,
            kv_scales=kv_scales,
        )
    if cos.dtype != np.float32:  # the contract's tables are float32; accept others at the cost of a copy
        cos, sin = cos.astype(np.float32), sin.astype(np.float32)
    out = backend.cp.empty((tokens, q_heads, d), dtype=BF16)
    if tokens:
        qs, ks, vs = element_strides(q), element_strides(k), element_strides(v)
        heads = q_heads + 2 * kv_heads
        rotated = batches_heads(tokens, heads, d, half, backend.profile.sm_count)
        per_warp = QKV_FUSED_BATCH if rotated else 1
        warps = min(QKV_FUSED_WARPS, math.ceil(heads / per_warp))
        backend._kernel("attention_inputs", f"qk_norm_rope_write_kv{f'_d{d}' if rotated else ''}_{dtype}")(
            (tokens, math.ceil(heads / (warps * per_warp))),
            (32 * warps,),
            (
                q,
                np.int64(qs[0]),
                np.int64(qs[1]),
                np.int32(q_heads),
                k,
                np.int64(ks[0]),
                np.int64(ks[1]),
                v,
                np.int64(vs[0]),
                np.int64(vs[1]),
                np.int32(kv_heads),
                null_or(q_norm_weight),
                null_or(k_norm_weight),
                np.float32(eps),
                positions,
                cos,
                sin,
                np.int32(half),
                out,
                k_cache,
                v_cache,
                slot_mapping,
                np.int32(d),
                np.float32(k_scale),
                np.float32(v_scale),
            ),
        )
    return out
