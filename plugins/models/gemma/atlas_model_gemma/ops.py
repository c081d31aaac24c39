"""The gemma op group, registered by this plugin (an op group of a family plugin, see `atlas_core.backends.ops`).

Ops the Gemma families need beyond the core: logit soft-capping, scaling by a constant (embedding
scale, per-layer-input scales, layer scalars), a scaled residual sum, a GELU-tanh gate whose two
operands live in separate arrays (Gemma 4's per-layer inputs), the average pooling of patch grids (Gemma 3's
multimodal projector, Gemma 4's vision pooler) and clamping (Gemma 4's clipped linears). Every op computes
in float32 and returns a new array in the dtype of its first argument; none works in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from atlas_core.backends.ops import OpGroup, on_host

if TYPE_CHECKING:
    from atlas_core.backends.base import Array

_SQRT_2_OVER_PI = np.float32(np.sqrt(2.0 / np.pi))


def soft_cap_reference(x: np.ndarray, cap: float) -> np.ndarray:
    """``cap * tanh(x / cap)``."""
    wide = x.astype(np.float32)
    return (np.tanh(wide / np.float32(cap)) * np.float32(cap)).astype(x.dtype)


def scale_reference(x: np.ndarray, factor: float) -> np.ndarray:
    """``x * factor`` (``factor`` as float32)."""
    return (x.astype(np.float32) * np.float32(factor)).astype(x.dtype)


def add_scaled_reference(x: np.ndarray, y: np.ndarray, factor: float) -> np.ndarray:
    """``(x + y) * factor``."""
    return ((x.astype(np.float32) + y.astype(np.float32)) * np.float32(factor)).astype(x.dtype)


def gelu_tanh_gate_reference(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """``gelu_tanh(gate) * up``."""
    g = gate.astype(np.float32)
    gelu = 0.5 * g * (1.0 + np.tanh(_SQRT_2_OVER_PI * (g + np.float32(0.044715) * g * g * g)))
    return (gelu * up.astype(np.float32)).astype(gate.dtype)


def pool_patches_reference(x: np.ndarray, grids: Sequence[tuple[int, int]], kernel: int) -> np.ndarray:
    """Mean of every ``kernel x kernel`` block of each patch grid: ``x[sum(rows * cols), C]`` holds grid ``i``'s
    ``rows_i x cols_i`` patches row-major, one grid after another -> each grid's blocks, row-major,
    ``[sum(rows * cols) / kernel**2, C]``."""
    width, start, pooled = x.shape[1], 0, []
    for rows, cols in grids:
        grid = x[start : start + rows * cols].astype(np.float32)
        blocks = grid.reshape(rows // kernel, kernel, cols // kernel, kernel, width)
        pooled.append(blocks.mean(axis=(1, 3), dtype=np.float32).reshape(-1, width))
        start += rows * cols
    return np.concatenate(pooled).astype(x.dtype)


def clamp_reference(x: np.ndarray, low: float, high: float) -> np.ndarray:
    """``min(max(x, low), high)`` elementwise (bounds as float32; infinite bounds leave ``x`` as is)."""
    return np.clip(x.astype(np.float32), np.float32(low), np.float32(high)).astype(x.dtype)


class GemmaOps(OpGroup):
    """The gemma op group: every op defaults to its NumPy reference run on the host; a backend's
    native implementation (registered through ``register_op_implementations``) overrides them."""

    name = "gemma"

    def soft_cap(self, x: Array, cap: float) -> Array:
        """Tanh soft-capping (Gemma's final logits): ``cap * tanh(x / cap)`` elementwise, any shape;
        ``cap > 0``. Float32 math; a new array in ``x``'s dtype."""
        return on_host(self.backend, soft_cap_reference, x, cap)

    def scale(self, x: Array, factor: float) -> Array:
        """``x * factor`` elementwise, any shape, with ``factor`` taken as float32 (a caller that wants
        it rounded to the activation dtype first, as Gemma's embedding scale is, rounds it itself).
        A new array in ``x``'s dtype."""
        return on_host(self.backend, scale_reference, x, factor)

    def add_scaled(self, x: Array, y: Array, factor: float = 1.0) -> Array:
        """``(x + y) * factor`` elementwise; ``x`` and ``y`` of one shape (either may be a strided view).
        Float32 math; a new array in ``x``'s dtype."""
        return on_host(self.backend, add_scaled_reference, x, y, factor)

    def gelu_tanh_gate(self, gate: Array, up: Array) -> Array:
        """``gelu_tanh(gate) * up`` elementwise for two arrays of one shape (``gelu_tanh`` as in
        `Backend.gelu_tanh_mul`, which takes both halves in one array). Float32 math; a new array in
        ``gate``'s dtype."""
        return on_host(self.backend, gelu_tanh_gate_reference, gate, up)

    def pool_patches(self, x: Array, grids: Sequence[tuple[int, int]], kernel: int) -> Array:
        """Average pooling of patch grids (Gemma 3's projector, ``AvgPool2d(kernel)``; Gemma 4's pooler):
        ``x`` is ``[sum(rows * cols), C]``, the ``rows x cols`` patches of each of the host ``grids`` row-major,
        one grid after another; every ``rows`` and ``cols`` a multiple of ``kernel``. Returns
        ``[sum(rows * cols) / kernel**2, C]``: each grid's ``kernel x kernel`` blocks, row-major, as the mean of
        their patches. Float32 math; a new array in ``x``'s dtype."""
        return on_host(self.backend, pool_patches_reference, x, [(int(r), int(c)) for r, c in grids], kernel)

    def clamp(self, x: Array, low: float, high: float) -> Array:
        """``x`` clamped to ``[low, high]`` elementwise, any shape (``low <= high``; either may be infinite).
        A new array in ``x``'s dtype."""
        return on_host(self.backend, clamp_reference, x, low, high)
