"""Gemma 4's vision side as layers: the vision tower and the multimodal embedder.

Layer types registered by this plugin: ``gemma4_vision_encoder_layer`` (RMSNorm sandwich around attention
and a GeGLU MLP; q/k/v projections without bias, per-head RMSNorm of q and k (learned) and v (unit),
2-D rotary, attention scale 1, full within each image; every projection optionally clipped) and
``gemma4_multimodal_embedder`` (RMSNorm without scale, projection to the text width).
`Gemma4VisionTower.encode` runs the patch embedding (``2 * (pixels - 0.5)`` through a linear map, plus a
learned column table and a learned row table), the encoder layers, the pooler (the mean of every
``kernel x kernel`` block of each image's patch grid, scaled by ``sqrt(hidden_size)``), the optional
standardisation ``(x - std_bias) * std_scale`` and the embedder over several images at once.

The rotary: transformers rotates the first half of each head by the patch's column and the second half by
its row, each half in rotate-half layout with ``head_dim / 4`` frequencies. The loader reorders the q and
k projections' rows (and the q/k norm weights) within each head by `axial_permutation`, which turns that
into one rotate-half rotation over the whole head with rows ``[column angles, row angles]`` (the layout
core's ``rope`` op and `VisionPatches` take); q . k, and so the attention, is unchanged by a permutation
applied to both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from atlas_core.backends.base import Array, Backend
from atlas_core.backends.ops.vision import VisionOps
from atlas_core.model.layers.norm import RMSNorm
from atlas_core.model.layers.vision import Linear, VisionPatches
from atlas_core.model.vision import ImageFeatures, PreparedImage
from atlas_model_gemma.ops import GemmaOps


def axial_permutation(head_dim: int) -> np.ndarray:
    """The order of a head's channels that turns Gemma 4's two half-head rotations into one rotate-half
    rotation (see the module docstring): quarters ``0, 2, 1, 3``."""
    quarter = head_dim // 4
    return np.concatenate([np.arange(quarter) + quarter * i for i in (0, 2, 1, 3)])


def patch_positions(grids: Sequence[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """``(columns, rows)`` int32 ``[N]`` of the patches of ``grids`` (``(rows, cols)`` each, patches row-major,
    one grid after another): transformers' ``pixel_position_ids`` ``(x, y)`` without padding."""
    ys, xs = zip(*(np.divmod(np.arange(rows * cols, dtype=np.int32), cols) for rows, cols in grids), strict=True)
    return np.concatenate(xs).astype(np.int32), np.concatenate(ys).astype(np.int32)


def axial_rotary(grids: Sequence[tuple[int, int]], head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin)`` rows ``[N, head_dim / 2]`` float32 for the patches of ``grids`` (as `patch_positions`):
    the first ``head_dim / 4`` angles are the column times the frequencies ``theta ** (-2i / (head_dim / 2))``,
    the rest the row times the same frequencies."""
    spatial = head_dim // 2
    inv_freq = (1.0 / theta ** (np.arange(0, spatial, 2, dtype=np.float32) / spatial)).astype(np.float32)
    columns, rows = (axis.astype(np.float32)[:, None] for axis in patch_positions(grids))
    angles = np.concatenate([columns * inv_freq, rows * inv_freq], axis=1)
    return np.cos(angles), np.sin(angles)


@dataclass
class ClippableLinear:
    """``x @ weight.T`` (no bias) with, when ``bounds`` is set, its input clamped to ``bounds[0:2]`` and its
    output to ``bounds[2:4]`` (transformers' ``Gemma4ClippableLinear`` with ``use_clipped_linears``)."""

    backend: Backend
    linear: Linear
    bounds: tuple[float, float, float, float] | None = None

    def __call__(self, x: Array) -> Array:
        if self.bounds is None:
            return self.linear(x)
        gemma, (low_in, high_in, low_out, high_out) = self.backend.ops(GemmaOps), self.bounds
        return gemma.clamp(self.linear(gemma.clamp(x, low_in, high_in)), low_out, high_out)


@dataclass
class Gemma4VisionEncoderLayer:
    """One encoder layer over ``x[N, C]``::

        h = input_norm(x)
        q, k, v = q_norm(q(h)), k_norm(k(h)), v_norm(v(h))          # per head, [N, heads, head_dim]
        x = x + post_attention_norm(o(attention(rotate(q), rotate(k), v)))   # scale 1, within each image
        h = pre_ffn_norm(x)
        x = x + post_ffn_norm(down(gelu_tanh(gate(h)) * up(h)))

    ``q``/``k`` rows and ``q_norm``/``k_norm`` weights come reordered by `axial_permutation`; ``v_norm`` has
    unit weights. Every norm is an RMSNorm scaling by ``w``."""

    backend: Backend
    input_norm: RMSNorm
    q: ClippableLinear
    k: ClippableLinear
    v: ClippableLinear
    o: ClippableLinear
    q_norm: RMSNorm
    k_norm: RMSNorm
    v_norm: RMSNorm
    post_attention_norm: RMSNorm
    pre_ffn_norm: RMSNorm
    gate: ClippableLinear
    up: ClippableLinear
    down: ClippableLinear
    post_ffn_norm: RMSNorm
    head_dim: int

    def __call__(self, x: Array, patches: VisionPatches) -> Array:
        tokens, dim = x.shape[0], self.head_dim
        h = self.input_norm(x)[0]
        q = self.q_norm(self.q(h).reshape(tokens, -1, dim))[0]
        k = self.k_norm(self.k(h).reshape(tokens, -1, dim))[0]
        v = self.v_norm(self.v(h).reshape(tokens, -1, dim))[0]
        patches.rotate(self.backend, q, k)
        mixed = self.backend.ops(VisionOps).segment_attention(q, k, v, patches.cu_seqlens, 1.0)
        x = x + self.post_attention_norm(self.o(mixed.reshape(tokens, -1)))[0]
        h = self.pre_ffn_norm(x)[0]
        gated = self.backend.ops(GemmaOps).gelu_tanh_gate(self.gate(h), self.up(h))
        return x + self.post_ffn_norm(self.down(gated))[0]


@dataclass
class MultimodalEmbedder:
    """``projection(norm(x))``: soft tokens ``[n, C]`` -> ``[n, H]`` text embeddings; ``norm`` an RMSNorm with
    unit weights, ``projection`` the ``[H, C]`` ``embedding_projection`` (no bias)."""

    backend: Backend
    norm: RMSNorm
    projection: Linear

    def __call__(self, x: Array) -> Array:
        return self.projection(self.norm(x)[0])


@dataclass
class Gemma4VisionTower:
    """The tower's weights as layers (see the module docstring): ``patch_embed`` (``input_proj``),
    ``columns`` / ``rows`` (the ``[P, C]`` halves of ``position_embedding_table``), the encoder ``layers``,
    the pooling ``kernel``, ``standardize`` (``(std_bias, std_scale)``, or None) and the ``embedder``."""

    backend: Backend
    patch_embed: Linear
    columns: Array
    rows: Array
    layers: list[Gemma4VisionEncoderLayer]
    kernel: int
    head_dim: int
    rope_theta: float
    standardize: tuple[Array, Array] | None
    embedder: MultimodalEmbedder

    def encode(self, images: Sequence[PreparedImage]) -> list[ImageFeatures]:
        """Every image's ``num_tokens`` features ``[num_tokens, H]`` (no deepstack), in one pass over all
        patches; each image attends to its own patches only."""
        backend, gemma = self.backend, self.backend.ops(GemmaOps)
        grids = [(int(image.grid[1]), int(image.grid[2])) for image in images]
        pixels = np.concatenate([image.pixel_values for image in images]).astype(np.float32)
        x = self.patch_embed(backend.from_numpy(2 * (pixels - np.float32(0.5))))
        columns, rows = patch_positions(grids)
        place = backend.embedding(self.columns, backend.from_numpy(columns))
        x = x + (place + backend.embedding(self.rows, backend.from_numpy(rows)))
        cos, sin = axial_rotary(grids, self.head_dim, self.rope_theta)
        patches = VisionPatches(
            np.concatenate([[0], np.cumsum([r * c for r, c in grids])]).astype(np.int64),
            backend.from_numpy(cos, dtype=np.dtype(np.float32)),
            backend.from_numpy(sin, dtype=np.dtype(np.float32)),
            backend.from_numpy(np.arange(len(cos), dtype=np.int32)),
        )
        for layer in self.layers:
            x = layer(x, patches)
        pooled = gemma.scale(gemma.pool_patches(x, grids, self.kernel), float(x.shape[1]) ** 0.5)
        if self.standardize is not None:
            bias, scale = self.standardize
            pooled = (pooled - bias) * scale
        tokens = self.embedder(pooled)
        features, start = [], 0
        for image in images:
            features.append(ImageFeatures(tokens[start : start + image.num_tokens], []))
            start += image.num_tokens
        return features
