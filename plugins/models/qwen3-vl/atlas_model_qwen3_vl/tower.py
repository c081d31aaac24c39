"""Qwen3-VL's vision tower: patch embedding, learned position grid, ViT blocks with 2-D rotary, the patch
merger and the deepstack mergers; `VisionTower.encode` runs it over several images at once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from atlas_core.backends.base import Array, Backend
from atlas_core.model.layers.vision import Linear, VisionBlock, VisionPatches
from atlas_core.model.vision import ImageFeatures, PreparedImage
from atlas_model_qwen3_vl.layers import PatchMerger

POSITION_CACHE = 8
"""How many image grids' resampled position embeddings a tower keeps (images of one size share them)."""


def block_order(grid_h: int, grid_w: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column of every patch in the processor's merge-block order (``merge x merge`` blocks row
    by row, each block's patches row by row)."""
    rows, cols = np.meshgrid(np.arange(grid_h), np.arange(grid_w), indexing="ij")
    shape = (grid_h // merge, merge, grid_w // merge, merge)
    return rows.reshape(shape).transpose(0, 2, 1, 3).ravel(), cols.reshape(shape).transpose(0, 2, 1, 3).ravel()


def bilinear_taps(index: np.ndarray, size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Two taps into a ``side``-long axis and their weights for positions ``index`` of an axis of ``size``
    (bilinear, corners aligned: position 0 maps to 0 and ``size - 1`` to ``side - 1``)."""
    source = index.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
    floor = np.floor(source)
    taps = np.clip(floor.astype(np.int64)[:, None] + np.arange(2), 0, side - 1)
    weights = np.clip(1 - np.abs(source[:, None] - floor[:, None] - np.arange(2)), 0, None)
    return taps, weights.astype(np.float32)


@dataclass
class VisionTower:
    """The tower's weights as layers. ``pos_embed`` is the host ``[side * side, C]`` learned grid,
    ``deepstack_layers[i]`` the block whose output feeds ``deepstack_mergers[i]``."""

    backend: Backend
    patch_embed: Linear
    pos_embed: np.ndarray
    blocks: list[VisionBlock]
    merger: PatchMerger
    deepstack_layers: list[int]
    deepstack_mergers: list[PatchMerger]
    num_heads: int
    merge_size: int
    rope_theta: float
    _positions: dict[tuple[int, ...], np.ndarray] = field(default_factory=dict, repr=False)
    _table: np.ndarray | None = field(default=None, repr=False)

    def position_embeddings(self, grid: tuple[int, ...]) -> np.ndarray:
        """The learned grid resampled to an image's ``(t, h, w)`` patch grid, in block order ``[t*h*w, C]``
        (read-only; the last `POSITION_CACHE` grids are kept)."""
        key = tuple(int(v) for v in grid)
        resampled = self._positions.pop(key, None)
        if resampled is None:
            resampled = self._resample(*key)
            resampled.flags.writeable = False
        self._positions[key] = resampled  # the most recently used last
        while len(self._positions) > POSITION_CACHE:
            self._positions.pop(next(iter(self._positions)))
        return resampled

    def _resample(self, t: int, h: int, w: int) -> np.ndarray:
        """Bilinear resampling of the ``[side, side, C]`` grid, one axis at a time (columns, then rows)."""
        side = int(round(self.pos_embed.shape[0] ** 0.5))
        if self._table is None:
            self._table = self.pos_embed.astype(np.float32).reshape(side, side, -1)
        col_taps, col_weights = bilinear_taps(np.arange(w), w, side)
        row_taps, row_weights = bilinear_taps(np.arange(h), h, side)
        across = sum(self._table[:, col_taps[:, k]] * col_weights[None, :, k, None] for k in range(2))  # [side, w, C]
        grid = sum(across[row_taps[:, k]] * row_weights[:, k, None, None] for k in range(2))  # [h, w, C]
        rows, cols = block_order(h, w, self.merge_size)
        return np.tile(grid[rows, cols], (t, 1))

    def rotary(self, grids: Sequence[tuple[int, ...]], head_dim: int) -> tuple[np.ndarray, np.ndarray]:
        """2-D rotary ``(cos, sin)`` rows ``[N, head_dim / 2]``: the first half of each row rotates by the
        patch's row, the second half by its column, with frequencies over ``head_dim / 2``."""
        quarter = head_dim // 2
        inv_freq = 1.0 / (self.rope_theta ** (np.arange(0, quarter, 2, dtype=np.float32) / quarter))
        angles = []
        for t, h, w in grids:
            rows, cols = block_order(h, w, self.merge_size)
            per_frame = np.concatenate([rows[:, None] * inv_freq, cols[:, None] * inv_freq], axis=1)
            angles.append(np.tile(per_frame, (t, 1)))
        joined = np.concatenate(angles).astype(np.float32)
        return np.cos(joined), np.sin(joined)

    def encode(self, images: Sequence[PreparedImage]) -> list[ImageFeatures]:
        """Every image's merged features and deepstack features, computed in one pass over all patches."""
        backend = self.backend
        grids = [image.grid for image in images]
        pixels = np.concatenate([image.pixel_values for image in images]).astype(np.float32)
        positions = np.concatenate([self.position_embeddings(grid) for grid in grids])
        x = self.patch_embed(backend.from_numpy(pixels)) + backend.from_numpy(positions)
        lengths = [int(np.prod(grid[1:])) for grid in grids for _ in range(grid[0])]  # attention per frame
        cos, sin = self.rotary(grids, x.shape[1] // self.num_heads)
        patches = VisionPatches(
            np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            backend.from_numpy(cos, dtype=np.dtype(np.float32)),
            backend.from_numpy(sin, dtype=np.dtype(np.float32)),
            backend.from_numpy(np.arange(len(cos), dtype=np.int32)),
        )
        deepstack: list[Array] = []
        for index, block in enumerate(self.blocks):
            x = block(x, patches)
            if index in self.deepstack_layers:
                deepstack.append(self.deepstack_mergers[self.deepstack_layers.index(index)](x))
        merged = self.merger(x)
        features, start = [], 0
        for image in images:
            stop = start + image.num_tokens
            features.append(ImageFeatures(merged[start:stop], [feature[start:stop] for feature in deepstack]))
            start = stop
        return features
