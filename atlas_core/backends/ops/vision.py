"""The ``vision`` op group: what vision towers (Qwen3-VL's and Qwen3.5's ViT, SigLIP) need beyond the core
backend contract.

LayerNorm with bias, GELU (exact or tanh) and full (non-causal) attention over the patches of each image
of a packed batch. Every op computes in float32 and returns a new array in the dtype of its first
argument; none works in place. The bodies are the host fallback (NumPy, through `on_host`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from atlas_core.backends.ops import OpGroup, on_host

if TYPE_CHECKING:
    from atlas_core.backends.base import Array

_SQRT_2_OVER_PI = np.sqrt(2.0 / np.pi)


def layer_norm_reference(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis."""
    wide = x.astype(np.float32)
    centred = wide - wide.mean(axis=-1, keepdims=True)
    normed = centred / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + np.float32(eps))
    return (normed * weight.astype(np.float32) + bias.astype(np.float32)).astype(x.dtype)


_ERF = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _erf(x: np.ndarray) -> np.ndarray:
    """The error function of float32 ``x`` (Abramowitz and Stegun 7.1.26, |error| < 1.5e-7), in float32."""
    a = np.abs(x)
    t = np.float32(0.3275911) * a
    t += 1
    np.reciprocal(t, out=t)
    poly = np.full_like(t, _ERF[-1])
    for coefficient in _ERF[-2::-1]:
        poly *= t
        poly += np.float32(coefficient)
    poly *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    poly *= a
    np.subtract(1, poly, out=poly)
    return np.copysign(poly, x, out=poly)


def gelu_reference(x: np.ndarray, approximate: bool) -> np.ndarray:
    """GELU: ``x * Phi(x)`` exactly (``approximate=False``, torch's ``nn.GELU()``) or with the tanh form
    (``gelu_pytorch_tanh``), in float32."""
    wide = x.astype(np.float32)
    if approximate:
        inner = np.square(wide)
        inner *= np.float32(0.044715)
        inner += 1
        inner *= wide
        inner *= np.float32(_SQRT_2_OVER_PI)
        np.tanh(inner, out=inner)
    else:
        inner = _erf(wide * np.float32(1 / np.sqrt(2.0)))
    inner += 1
    inner *= wide
    inner *= np.float32(0.5)
    return inner.astype(x.dtype, copy=False)


def segment_attention_reference(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, cu_seqlens: np.ndarray, scale: float
) -> np.ndarray:
    """Full attention within each segment: ``q``/``k``/``v`` ``[N, heads, D]``; segment ``i`` is rows
    ``cu_seqlens[i] .. cu_seqlens[i + 1] - 1`` and attends to itself only, without a causal mask."""
    out = np.empty(q.shape, dtype=np.float32)
    for start, stop in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist(), strict=True):
        qs, ks, vs = (a[start:stop].astype(np.float32).transpose(1, 0, 2) for a in (q, k, v))
        scores = qs @ ks.transpose(0, 2, 1) * np.float32(scale)
        scores -= scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores)
        weights /= weights.sum(axis=-1, keepdims=True)
        out[start:stop] = (weights @ vs).transpose(1, 0, 2)
    return out.astype(q.dtype)


class VisionOps(OpGroup):
    """The vision towers' ops (see the module docstring)."""

    name = "vision"

    def layer_norm(self, x: Array, weight: Array, bias: Array, eps: float) -> Array:
        """LayerNorm of ``x[..., C]`` with ``weight[C]`` and ``bias[C]``."""
        return on_host(self.backend, layer_norm_reference, x, weight, bias, eps)

    def gelu(self, x: Array, approximate: bool) -> Array:
        """GELU of ``x``, exact or tanh-approximated."""
        return on_host(self.backend, gelu_reference, x, approximate)

    def segment_attention(self, q: Array, k: Array, v: Array, cu_seqlens: np.ndarray, scale: float) -> Array:
        """Full attention of ``q``/``k``/``v`` ``[N, heads, D]`` within the segments of host ``cu_seqlens``."""
        return on_host(self.backend, segment_attention_reference, q, k, v, cu_seqlens, scale)
