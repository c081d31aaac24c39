"""The Gemma family's ``gemma`` op group on CUDA: each op one grid-stride elementwise kernel of
``elementwise.cu`` (bf16 in and out, fp32 math) over rows with their own strides.

This module imports ``atlas_model_gemma``; the plugin registers it only where that family is installed,
and it is imported only when a Gemma model asks its backend for the group.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from atlas_model_gemma.ops import GemmaOps

from atlas_core.backends.base import Array
from atlas_gb10.arrays import BF16, null_or
from atlas_gb10.backend import CudaBackend

BLOCKS_PER_SM = 8
"""Grid-stride launches use at most this many 256-thread blocks per SM."""


class CudaGemmaOps(GemmaOps):
    """`GemmaOps` as CUDA kernels; every op returns a new contiguous array in ``x``'s shape."""

    backend: CudaBackend

    def soft_cap(self, x: Array, cap: float) -> Array:
        return self._map("gemma_soft_cap_bf16", x, None, cap)

    def scale(self, x: Array, factor: float) -> Array:
        return self._map("gemma_scale_bf16", x, None, factor)

    def add_scaled(self, x: Array, y: Array, factor: float = 1.0) -> Array:
        if tuple(x.shape) != tuple(y.shape):
            raise ValueError(f"add_scaled: x {tuple(x.shape)} and y {tuple(y.shape)} must have one shape")
        return self._map("gemma_add_scaled_bf16", x, y, factor)

    def gelu_tanh_gate(self, gate: Array, up: Array) -> Array:
        if tuple(gate.shape) != tuple(up.shape):
            raise ValueError(f"gelu_tanh_gate: gate {tuple(gate.shape)} and up {tuple(up.shape)} must have one shape")
        return self._map("gemma_gelu_tanh_gate_bf16", gate, up, 0.0)

    def _map(self, kernel: str, x: Array, y: Array | None, value: float) -> Array:
        """``out = op(x, y)`` elementwise through ``kernel`` with the float argument ``value``."""
        backend = self.backend
        backend.require_bf16(kernel, x, y)
        out = backend.cp.empty(x.shape, dtype=BF16)
        if out.size == 0:
            return out
        cols = int(x.shape[-1]) if x.ndim else 1
        rows_x, rows_y = self._rows(x, cols), None if y is None else self._rows(y, cols)
        total = out.size
        blocks = min(math.ceil(total / 256), BLOCKS_PER_SM * max(1, backend.profile.sm_count))
        backend.kernels.function("elementwise", kernel)(
            (blocks,),
            (256,),
            (
                rows_x,
                np.int64(self._row_stride(rows_x)),
                null_or(rows_y),
                np.int64(0 if rows_y is None else self._row_stride(rows_y)),
                out,
                np.int32(cols),
                np.int64(total // cols),
                np.float32(value),
            ),
        )
        return out

    def _rows(self, a: Array, cols: int) -> Any:
        """``a`` as ``[rows, cols]`` with contiguous rows: a view where its strides allow, else a copy."""
        a = self.backend.contiguous_rows(a) if a.ndim else a.reshape(1)
        return a.reshape(-1, cols)

    @staticmethod
    def _row_stride(rows: Any) -> int:
        return rows.strides[0] // rows.itemsize
