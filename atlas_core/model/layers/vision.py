"""Vision-tower layers shared by families: LayerNorm and Linear with bias, the patches one encoder call
shares (`VisionPatches`) and the pre-norm ViT block (`VisionBlock`, layer type ``vision_block``: Qwen3-VL's
and Qwen3.5's with 2-D rotary, SigLIP's without), over the core ``vision`` op group."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from atlas_core.backends.base import Array, Backend
from atlas_core.backends.ops.vision import VisionOps

LAYER_NORM_EPS = 1e-6


@dataclass
class LayerNorm:
    """LayerNorm with bias over the last axis."""

    backend: Backend
    weight: Array
    bias: Array
    eps: float = LAYER_NORM_EPS

    def __call__(self, x: Array) -> Array:
        return self.backend.ops(VisionOps).layer_norm(x, self.weight, self.bias, self.eps)


@dataclass
class Linear:
    """``x @ weight.T + bias``."""

    backend: Backend
    weight: Array
    bias: Array | None

    def __call__(self, x: Array) -> Array:
        return self.backend.linear(x, self.weight, self.bias)


@dataclass
class VisionPatches:
    """What every block of one encoder call shares: the segments (one per image, host ``cu_seqlens``) and
    the 2-D rotary rows ``cos``/``sin`` ``[N, D/2]`` with ``rows = arange(N)`` (backend arrays; all None for
    towers without rotary, such as SigLIP's, which add learned positions to the patch embeddings instead)."""

    cu_seqlens: np.ndarray
    cos: Array | None = None
    sin: Array | None = None
    rows: Array | None = None

    def rotate(self, backend: Backend, q: Array, k: Array) -> None:
        """Rotate ``q`` and ``k`` ``[N, heads, D]`` in place by the rotary rows (nothing without them)."""
        if self.cos is not None and self.sin is not None and self.rows is not None:
            backend.rope(q, k, self.rows, self.cos, self.sin)


class VisionBlock:
    """``x + proj(attention(norm1(x)))``, then ``+ fc2(gelu_tanh(fc1(norm2(x))))``; the attention is full
    within each image, with q and k rotated by the patches' (row, column) rotary when `VisionPatches` has it."""

    def __init__(
        self,
        backend: Backend,
        norm1: LayerNorm,
        qkv: Linear,
        proj: Linear,
        norm2: LayerNorm,
        fc1: Linear,
        fc2: Linear,
        num_heads: int,
    ) -> None:
        self.backend, self.norm1, self.qkv, self.proj = backend, norm1, qkv, proj
        self.norm2, self.fc1, self.fc2, self.num_heads = norm2, fc1, fc2, num_heads

    def __call__(self, x: Array, patches: VisionPatches) -> Array:
        backend, ops = self.backend, self.backend.ops(VisionOps)
        tokens, width = x.shape
        head_dim = width // self.num_heads
        qkv = self.qkv(self.norm1(x)).reshape(tokens, 3, self.num_heads, head_dim)
        q, k, v = qkv[:, 0].copy(), qkv[:, 1].copy(), qkv[:, 2]
        patches.rotate(backend, q, k)
        mixed = ops.segment_attention(q, k, v, patches.cu_seqlens, head_dim**-0.5)
        x = x + self.proj(mixed.reshape(tokens, width))
        return x + self.fc2(ops.gelu(self.fc1(self.norm2(x)), approximate=True))
