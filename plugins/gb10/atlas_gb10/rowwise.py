"""The cuda backend's row-wise ops on activations (`CudaBackend.rms_norm`, `silu_mul`, `gelu_tanh_mul`): one
kernel of ``kernels/elementwise.cu`` each, every row computed the same way whatever the batch."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from atlas_core.backends.base import Array
from atlas_gb10.arrays import BF16, element_strides, null_or

if TYPE_CHECKING:
    from atlas_gb10.backend import CudaBackend


def rms_norm(
    backend: CudaBackend, x: Array, weight: Array, eps: float, residual: Array | None = None
) -> tuple[Array, Array]:
    """`Backend.rms_norm`: 16-byte loads where rows allow, a warp per row up to 256 wide, 128 threads a row up
    to 1024, 256 beyond (unaligned rows: a warp per row up to 1024 wide, 256 threads beyond)."""
    backend.require_bf16("rms_norm", x, weight, residual)
    shape, d = x.shape, x.shape[-1]
    if x.ndim > 3 or x.strides[-1] != x.itemsize:
        x = backend.cp.ascontiguousarray(x)
    if residual is not None and (residual.ndim > 3 or residual.strides[-1] != residual.itemsize):
        residual = backend.cp.ascontiguousarray(residual)
    rows = math.prod(shape[:-1])
    normed = backend.cp.empty(shape, dtype=BF16)
    summed = backend.cp.empty(shape, dtype=BF16) if residual is not None else None
    if rows:
        inner = shape[1] if x.ndim == 3 else 1
        xs, rs = row_layout(x), row_layout(residual) if residual is not None else (0, 0)
        args = (
            x,
            np.int64(xs[0]),
            np.int64(xs[1]),
            null_or(residual),
            np.int64(rs[0]),
            np.int64(rs[1]),
            np.int32(inner),
            weight,
            normed,
            null_or(summed),
            np.float32(eps),
            np.int32(d),
            np.int64(rows),
        )
        aligned = (
            d % 8 == 0
            and d <= 8192
            and all(
                a is None or (a.data.ptr % 16 == 0 and all(s % 8 == 0 for s in row_layout(a)))
                for a in (x, residual, weight)
            )
        )
        suffix = "_vec_bf16" if aligned else "_bf16"
        if aligned and 256 < d <= 1024:
            backend._kernel("rms_norm", "rms_norm_quad" + suffix)((rows,), (128,), args)
        elif d <= 1024:
            backend._kernel("rms_norm", "rms_norm_warp" + suffix)((math.ceil(rows / 4),), (128,), args)
        else:
            backend._kernel("rms_norm", "rms_norm_block" + suffix)((rows,), (256,), args)
    return normed, (summed if residual is not None else x)


def row_layout(x: Array) -> tuple[int, int]:
    """(stride of the outer axis, stride of the per-head axis) in elements, for 1-3 dims."""
    strides = element_strides(x)
    if x.ndim == 3:
        return strides[0], strides[1]
    if x.ndim == 2:
        return strides[0], 0
    return 0, 0


def gated(backend: CudaBackend, kernel_name: str, x: Array, out: Array | None) -> Array:
    """`Backend.silu_mul` / `gelu_tanh_mul` through ``kernel_name``: ``[rows, 2 * inner]`` -> ``[rows, inner]``."""
    backend.require_bf16(kernel_name, x, out)
    x = backend.contiguous_rows(x)
    rows, inner = x.shape[0], x.shape[1] // 2
    if out is None:
        out = backend.cp.empty((rows, inner), dtype=BF16)
    total = rows * inner
    if total:
        blocks = min(math.ceil(total / 256), 8 * max(1, backend.profile.sm_count))
        backend._kernel("elementwise", kernel_name)(
            (blocks,),
            (256,),
            (
                x,
                np.int64(element_strides(x)[0]),
                out,
                np.int64(element_strides(out)[0]),
                np.int32(inner),
                np.int64(rows),
            ),
        )
    return out
