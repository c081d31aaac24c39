"""The Gemma family's ``gemma`` op group on CUDA: each op one grid-stride kernel of ``elementwise.cu`` (bf16 in
and out, fp32 math) over rows with their own strides; `pool_patches` reads each output's block through a
host-built table of its first patch and its grid's width.

This module imports ``atlas_model_gemma``; the plugin registers it only where that family is installed,
and it is imported only when a Gemma model asks its backend for the group.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from atlas_model_gemma.ops import GemmaOps

from atlas_core.backends.base import Array
from atlas_gb10.arrays import BF16
from atlas_gb10.backend import CudaBackend
from atlas_gb10.rowmap import as_rows, grid_blocks, map_rows, row_stride


class CudaGemmaOps(GemmaOps):
    """`GemmaOps` as CUDA kernels; every op returns a new contiguous array in ``x``'s shape."""

    backend: CudaBackend

    def soft_cap(self, x: Array, cap: float) -> Array:
        return map_rows(self.backend, "gemma_soft_cap_bf16", x, None, cap)

    def scale(self, x: Array, factor: float) -> Array:
        return map_rows(self.backend, "gemma_scale_bf16", x, None, factor)

    def add_scaled(self, x: Array, y: Array, factor: float = 1.0) -> Array:
        if tuple(x.shape) != tuple(y.shape):
            raise ValueError(f"add_scaled: x {tuple(x.shape)} and y {tuple(y.shape)} must have one shape")
        return map_rows(self.backend, "gemma_add_scaled_bf16", x, y, factor)

    def gelu_tanh_gate(self, gate: Array, up: Array) -> Array:
        if tuple(gate.shape) != tuple(up.shape):
            raise ValueError(f"gelu_tanh_gate: gate {tuple(gate.shape)} and up {tuple(up.shape)} must have one shape")
        return map_rows(self.backend, "gemma_gelu_tanh_gate_bf16", gate, up, 0.0)

    def clamp(self, x: Array, low: float, high: float) -> Array:
        backend = self.backend
        backend.require_bf16("clamp", x)
        cols = int(x.shape[-1]) if x.ndim else 1
        rows = as_rows(backend, x, cols)
        out = backend.cp.empty(x.shape, dtype=BF16)
        if out.size:
            backend.kernels.function("elementwise", "gemma_clamp_bf16")(
                (grid_blocks(backend, out.size),),
                (256,),
                (
                    rows,
                    np.int64(row_stride(rows)),
                    out,
                    np.int32(cols),
                    np.int64(rows.shape[0]),
                    np.float32(low),
                    np.float32(high),
                ),
            )
        return out

    def pool_patches(self, x: Array, grids: Sequence[tuple[int, int]], kernel: int) -> Array:
        backend = self.backend
        backend.require_bf16("pool_patches", x)
        channels = int(x.shape[1])
        first, width, start = [], [], 0
        for rows, cols in grids:
            block_rows, block_cols = np.meshgrid(np.arange(rows // kernel), np.arange(cols // kernel), indexing="ij")
            first.append(start + (block_rows * kernel * cols + block_cols * kernel).ravel())
            width.append(np.full(block_rows.size, cols))
            start += rows * cols
        if start != x.shape[0]:
            raise ValueError(f"pool_patches: grids {list(grids)} hold {start} patches, x has {x.shape[0]}")
        outputs = sum(len(f) for f in first)
        out = backend.cp.empty((outputs, channels), dtype=BF16)
        if out.size:
            patches = as_rows(backend, x, channels)
            backend.kernels.function("elementwise", "gemma_pool_patches_bf16")(
                (grid_blocks(backend, out.size),),
                (256,),
                (
                    patches,
                    np.int64(row_stride(patches)),
                    backend.cp.asarray(np.concatenate(first).astype(np.int32)),
                    backend.cp.asarray(np.concatenate(width).astype(np.int32)),
                    out,
                    np.int32(channels),
                    np.int64(outputs),
                    np.int32(kernel),
                ),
            )
        return out
