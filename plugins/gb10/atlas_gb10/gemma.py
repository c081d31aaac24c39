"""The Gemma family's ``gemma`` op group on CUDA: each op one grid-stride elementwise kernel of
``elementwise.cu`` (bf16 in and out, fp32 math) over rows with their own strides.

This module imports ``atlas_model_gemma``; the plugin registers it only where that family is installed,
and it is imported only when a Gemma model asks its backend for the group.
"""

from __future__ import annotations

from atlas_model_gemma.ops import GemmaOps

from atlas_core.backends.base import Array
from atlas_gb10.backend import CudaBackend
from atlas_gb10.rowmap import map_rows


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
        return map_rows(self.backend, kernel, x, y, value)
