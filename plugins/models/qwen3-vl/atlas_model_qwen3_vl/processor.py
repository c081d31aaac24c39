"""Qwen3-VL's image preprocessing, as transformers' ``Qwen2VLImageProcessor`` does it, with Pillow.

Reads the checkpoint's ``preprocessor_config.json``: the pixel budget (``size.shortest_edge`` /
``size.longest_edge``, or the older ``min_pixels`` / ``max_pixels``), ``patch_size``, ``merge_size``,
``temporal_patch_size``, the rescale factor and the normalisation mean and std. An image is resized with
Pillow (bicubic) to the nearest size within the budget whose sides are multiples of
``patch_size * merge_size`` (`smart_resize`), rescaled to [0, 1], normalised, then cut into patches of
``temporal_patch_size`` frames (an image repeats itself) grouped by ``merge_size x merge_size`` blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from atlas_core.errors import InvalidRequestError
from atlas_core.model.images import read_preprocessor_config
from atlas_core.model.vision import PreparedImage

MAX_ASPECT_RATIO = 200


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """``(height, width)`` rounded to multiples of ``factor`` with ``min_pixels <= h * w <= max_pixels``,
    keeping the aspect ratio as closely as possible (transformers' ``smart_resize``).
    `InvalidRequestError` for an aspect ratio above 200."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise InvalidRequestError(f"the image is {width}x{height}: its aspect ratio must be at most {MAX_ASPECT_RATIO}")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class ImageProcessor:
    """The settings of one checkpoint's image processor (defaults: Qwen3-VL's published ones)."""

    patch_size: int = 16
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 65536
    max_pixels: int = 16777216
    rescale_factor: float = 1 / 255
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)

    @classmethod
    def from_folder(cls, folder: Path, vision_config: dict[str, Any]) -> ImageProcessor:
        """Read ``preprocessor_config.json`` in ``folder``; without one, the vision config's patch sizes and
        Qwen3-VL's defaults for the rest."""
        config = read_preprocessor_config(folder)
        size = config.get("size") or {}
        return cls(
            patch_size=int(config.get("patch_size", vision_config.get("patch_size", cls.patch_size))),
            merge_size=int(config.get("merge_size", vision_config.get("spatial_merge_size", cls.merge_size))),
            temporal_patch_size=int(
                config.get("temporal_patch_size", vision_config.get("temporal_patch_size", cls.temporal_patch_size))
            ),
            min_pixels=int(size.get("shortest_edge", config.get("min_pixels", cls.min_pixels))),
            max_pixels=int(size.get("longest_edge", config.get("max_pixels", cls.max_pixels))),
            rescale_factor=float(config.get("rescale_factor", cls.rescale_factor)),
            mean=tuple(float(v) for v in config.get("image_mean", cls.mean)),
            std=tuple(float(v) for v in config.get("image_std", cls.std)),
        )

    @property
    def factor(self) -> int:
        """What both resized sides are multiples of."""
        return self.patch_size * self.merge_size

    def resized_size(self, width: int, height: int, max_pixels: int | None = None) -> tuple[int, int]:
        """``(height, width)`` an image of ``width x height`` is resized to (budget capped at ``max_pixels``)."""
        budget = self.max_pixels if max_pixels is None else max(min(self.max_pixels, max_pixels), self.min_pixels)
        return smart_resize(height, width, self.factor, self.min_pixels, budget)

    def __call__(self, image: Image.Image, max_pixels: int | None = None) -> PreparedImage:
        """``image`` -> flattened patches ``[grid_h * grid_w, 3 * temporal_patch_size * patch_size**2]`` in
        merge-block order, grid ``(1, grid_h, grid_w)``, ``grid_h * grid_w / merge_size**2`` tokens."""
        rgb = image if image.mode == "RGB" else image.convert("RGB")
        height, width = self.resized_size(rgb.width, rgb.height, max_pixels)
        resized = np.asarray(rgb.resize((width, height), Image.Resampling.BICUBIC))
        mean, std = np.asarray(self.mean), np.asarray(self.std)  # rescale and normalise as one multiply-add
        scale, offset = (self.rescale_factor / std).astype(np.float32), (-mean / std).astype(np.float32)
        pixels = (resized.astype(np.float32) * scale + offset).transpose(2, 0, 1)
        p, m, t = self.patch_size, self.merge_size, self.temporal_patch_size
        grid_h, grid_w = height // p, width // p
        patches = pixels.reshape(3, grid_h // m, m, p, grid_w // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
        frames = np.broadcast_to(patches[:, :, :, :, :, None], (*patches.shape[:5], t, p, p))
        flat = np.ascontiguousarray(frames.reshape(grid_h * grid_w, 3 * t * p * p))
        return PreparedImage.make(flat, (1, grid_h, grid_w), grid_h * grid_w // (m * m), identity=resized)
