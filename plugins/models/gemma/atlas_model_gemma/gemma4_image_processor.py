"""Gemma 4's image preprocessing, as transformers' ``Gemma4ImageProcessorPil`` does it by default, with Pillow.

Reads the checkpoint's ``preprocessor_config.json``: ``patch_size`` (16), ``pooling_kernel_size`` (3),
``max_soft_tokens`` (280; one of 70, 140, 280, 560, 1120), the Pillow ``resample`` filter (3, bicubic), the
rescale factor (1/255) and the optional normalisation (off by default: Gemma 4 reads pixels in [0, 1]).

An image is converted to RGB and resized, keeping its aspect ratio, to the largest size whose sides are
multiples of ``pooling_kernel_size * patch_size`` and that holds at most ``max_soft_tokens * kernel**2``
patches (`target_size`, transformers' ``get_aspect_ratio_preserving_size``); it takes one soft token per
``kernel x kernel`` patches, so images of other shapes take different numbers of tokens. Its pixels are
rescaled (float64, then float32) and cut into patches, row-major, each flattened as ``(row, column,
channel)``. transformers pads every image's patches to the budget (positions -1); the padding never reaches
the features, so `PreparedImage.pixel_values` holds the real patches only and the grid gives their positions.

``max_pixels`` (the server's ``--vision-max-pixels``) lowers the patch budget to ``max_pixels //
patch_size**2`` patches (at least one soft token's worth), as a smaller ``max_soft_tokens`` would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from atlas_core.errors import InvalidRequestError, ModelLoadError
from atlas_core.model.images import PREPROCESSOR_CONFIG, read_preprocessor_config
from atlas_core.model.vision import PreparedImage
from atlas_model_gemma.image_processor import channels_first

BICUBIC = 3
"""``PIL.Image.Resampling.BICUBIC``: transformers' default for Gemma 4."""
SUPPORTED_SOFT_TOKENS = (70, 140, 280, 560, 1120)
"""The budgets transformers' processor accepts."""


def target_size(height: int, width: int, patch: int, max_patches: int, kernel: int) -> tuple[int, int]:
    """``(height, width)`` an image is resized to (transformers' ``get_aspect_ratio_preserving_size``): the
    largest multiples of ``kernel * patch`` that keep the aspect ratio within ``max_patches`` patches; a side
    that would round to 0 takes one block and the other ``floor(ratio)`` blocks (at most the budget's side).
    `InvalidRequestError` when no size fits."""
    target_px = max_patches * patch**2
    factor = math.sqrt(target_px / (height * width))
    side = kernel * patch
    target_height = int(math.floor(factor * height / side)) * side
    target_width = int(math.floor(factor * width / side)) * side
    if target_height == 0 and target_width == 0:
        raise InvalidRequestError(f"a {width} x {height} image cannot be resized to fit {max_patches} patches")
    longest = (max_patches // kernel**2) * side
    if target_height == 0:
        target_height, target_width = side, min(int(math.floor(width / height)) * side, longest)
    elif target_width == 0:
        target_height, target_width = min(int(math.floor(height / width)) * side, longest), side
    if target_height * target_width > target_px:
        raise InvalidRequestError(
            f"a {width} x {height} image resizes to {target_width} x {target_height}, over {max_patches} patches"
        )
    return target_height, target_width


def patchify(pixels: np.ndarray, patch: int) -> np.ndarray:
    """``[C, H, W]`` -> ``[(H / patch) * (W / patch), patch * patch * C]``: patches row-major, each flattened
    as ``(row, column, channel)`` (transformers' ``convert_image_to_patches``)."""
    channels, height, width = pixels.shape
    grid = pixels.reshape(channels, height // patch, patch, width // patch, patch)
    return np.ascontiguousarray(grid.transpose(1, 3, 2, 4, 0).reshape(-1, patch * patch * channels))


@dataclass(frozen=True)
class Gemma4ImageProcessor:
    """One checkpoint's image settings (see the module docstring); ``max_position`` is the vision tower's
    ``position_embedding_size`` (no grid may have more patches per side)."""

    patch_size: int = 16
    pooling_kernel_size: int = 3
    max_soft_tokens: int = 280
    max_position: int = 10_240
    resample: int = BICUBIC
    rescale_factor: float = 1 / 255
    do_rescale: bool = True
    do_normalize: bool = False
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)

    @classmethod
    def from_folder(cls, folder: Path, vision: dict[str, Any]) -> Gemma4ImageProcessor:
        """Read ``preprocessor_config.json`` in ``folder`` (absent: transformers' defaults, with the vision
        config's ``patch_size`` and ``pooling_kernel_size``). `ModelLoadError` naming the file when its
        settings do not fit the tower (``vision``) or transformers would refuse them."""
        path = folder / PREPROCESSOR_CONFIG
        config = read_preprocessor_config(folder)
        patch, kernel = int(vision["patch_size"]), int(vision["pooling_kernel_size"])
        for key, want in (("patch_size", patch), ("pooling_kernel_size", kernel)):
            if config.get(key) is not None and int(config[key]) != want:
                raise ModelLoadError(f"{path}: {key} {config[key]} must be the vision tower's {want}")
        tokens = int(config.get("max_soft_tokens") or cls.max_soft_tokens)
        if tokens not in SUPPORTED_SOFT_TOKENS:
            raise ModelLoadError(f"{path}: max_soft_tokens {tokens} must be one of {SUPPORTED_SOFT_TOKENS}")
        if config.get("do_resize") is False:
            raise ModelLoadError(f"{path}: do_resize false is not supported (images must fit the patch budget)")
        resample = config.get("resample")
        resample = BICUBIC if resample is None else int(resample)
        if resample not in {member.value for member in Image.Resampling}:
            raise ModelLoadError(f"{path}: resample {resample} is not a Pillow resampling filter")
        return cls(
            patch_size=patch,
            pooling_kernel_size=kernel,
            max_soft_tokens=tokens,
            max_position=int(vision["position_embedding_size"]),
            resample=resample,
            rescale_factor=float(config.get("rescale_factor") or cls.rescale_factor),
            do_rescale=config.get("do_rescale") is not False,
            do_normalize=bool(config.get("do_normalize")),
            mean=tuple(float(v) for v in config.get("image_mean") or cls.mean),
            std=tuple(float(v) for v in config.get("image_std") or cls.std),
        )

    def max_patches(self, max_pixels: int | None) -> int:
        """The patch budget: ``max_soft_tokens * kernel**2``, lowered to ``max_pixels // patch**2`` (but never
        below one soft token's ``kernel**2`` patches) when ``max_pixels`` is given."""
        budget = self.max_soft_tokens * self.pooling_kernel_size**2
        if max_pixels is None:
            return budget
        return max(self.pooling_kernel_size**2, min(budget, max_pixels // self.patch_size**2))

    def __call__(self, image: Image.Image, max_pixels: int | None = None) -> PreparedImage:
        """``image`` -> its patches ``[rows * cols, patch**2 * 3]`` float32 (transformers' ``pixel_values``
        of the image without padding rows), grid ``(1, rows, cols)`` in patches, and ``rows * cols /
        kernel**2`` tokens."""
        rgb = image if image.mode == "RGB" else image.convert("RGB")
        patch = self.patch_size
        height, width = target_size(
            rgb.height, rgb.width, patch, self.max_patches(max_pixels), self.pooling_kernel_size
        )
        rows, cols = height // patch, width // patch
        if max(rows, cols) > self.max_position:
            raise InvalidRequestError(
                f"a {rgb.width} x {rgb.height} image takes a {cols} x {rows} patch grid, past the vision tower's "
                f"{self.max_position} positions per side"
            )
        if (height, width) != (rgb.height, rgb.width):
            rgb = rgb.resize((width, height), Image.Resampling(self.resample))
        normalization = (self.mean, self.std) if self.do_normalize else None
        pixels = channels_first(rgb, self.rescale_factor if self.do_rescale else None, normalization)
        tokens = rows * cols // self.pooling_kernel_size**2
        return PreparedImage.make(patchify(pixels, patch), (1, rows, cols), tokens)
