"""Gemma 3's image preprocessing, as transformers' ``Gemma3ImageProcessorPil`` does it by default, with Pillow.

Reads the checkpoint's ``preprocessor_config.json``: the square ``size`` (``height`` / ``width``; without it
the vision tower's ``image_size``), the Pillow ``resample`` filter (2, bilinear, by default), the rescale
factor and the normalisation mean and std (0.5 each by default). An image is converted to RGB, resized to
``size x size`` whatever its aspect ratio, rescaled (in float64, then float32) and normalised (in float32).

Pan-and-scan (``do_pan_and_scan``, extra crops of very wide or tall images) is not implemented: a config
that turns it on is loaded with a warning and every image is encoded whole, as transformers does with its
processor's default ``do_pan_and_scan=False``. ``max_pixels`` does not apply: the tower takes one size.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from atlas_core.errors import ModelLoadError
from atlas_core.model.images import PREPROCESSOR_CONFIG, read_preprocessor_config
from atlas_core.model.vision import PreparedImage

log = logging.getLogger("atlas.models.gemma")

BILINEAR = 2
"""``PIL.Image.Resampling.BILINEAR``: transformers' default for Gemma 3 (and what its checkpoints name)."""


def channels_first(
    image: Image.Image, rescale: float | None, normalization: tuple[tuple[float, ...], tuple[float, ...]] | None
) -> np.ndarray:
    """An RGB ``image`` -> ``[3, H, W]`` float32 as transformers' PIL processors make it: times ``rescale``
    (in float64, then float32; None: not rescaled), then ``(x - mean) / std`` per channel in float32 when
    ``normalization`` is ``(mean, std)``."""
    pixels = np.asarray(image).transpose(2, 0, 1)
    if rescale is not None:
        pixels = (pixels.astype(np.float64) * rescale).astype(np.float32)
    pixels = pixels.astype(np.float32)
    if normalization is not None:
        mean, std = (np.asarray(values, dtype=np.float32)[:, None, None] for values in normalization)
        pixels = (pixels - mean) / std
    return pixels


@dataclass(frozen=True)
class Gemma3ImageProcessor:
    """One checkpoint's image settings: the square side in pixels, the patch side, the number of tokens an
    image takes in the prompt, the Pillow filter, the rescale factor and the per-channel mean and std."""

    image_size: int
    patch_size: int
    num_tokens: int
    resample: int = BILINEAR
    rescale_factor: float = 1 / 255
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    do_rescale: bool = True
    do_normalize: bool = True

    @classmethod
    def from_folder(cls, folder: Path, vision: dict[str, Any], num_tokens: int) -> Gemma3ImageProcessor:
        """Read ``preprocessor_config.json`` in ``folder`` (absent: transformers' defaults) for a tower with
        ``vision_config`` ``vision`` whose images take ``num_tokens`` tokens. `ModelLoadError` when its size
        is not the square the tower was trained on, or its filter is not one of Pillow's."""
        path = folder / PREPROCESSOR_CONFIG
        config = read_preprocessor_config(folder)
        image_size = int(vision.get("image_size", 224))
        size = config.get("size") or {"height": image_size, "width": image_size}
        if (size.get("height"), size.get("width")) != (image_size, image_size):
            raise ModelLoadError(
                f"{path}: size {size} must be {{'height': {image_size}, 'width': {image_size}}} "
                "(the vision tower's image_size)"
            )
        if config.get("do_pan_and_scan"):
            log.warning("%s: do_pan_and_scan is not supported; images are encoded whole, without crops", path)
        resample = config.get("resample")
        resample = BILINEAR if resample is None else int(resample)
        if resample not in {member.value for member in Image.Resampling}:
            raise ModelLoadError(f"{path}: resample {resample} is not a Pillow resampling filter")
        if config.get("do_resize") is False:
            raise ModelLoadError(f"{path}: do_resize false is not supported (the tower takes {image_size} px)")
        return cls(
            image_size=image_size,
            patch_size=int(vision.get("patch_size", 16)),
            num_tokens=num_tokens,
            resample=resample,
            rescale_factor=float(config.get("rescale_factor") or cls.rescale_factor),
            mean=tuple(float(v) for v in config.get("image_mean") or cls.mean),
            std=tuple(float(v) for v in config.get("image_std") or cls.std),
            do_rescale=config.get("do_rescale") is not False,
            do_normalize=config.get("do_normalize") is not False,
        )

    @property
    def normalization(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """``(mean, std)`` when pixels are normalised, else None."""
        return (self.mean, self.std) if self.do_normalize else None

    @property
    def grid(self) -> tuple[int, int, int]:
        """``(1, side, side)``: the patch grid of every image."""
        side = self.image_size // self.patch_size
        return (1, side, side)

    def __call__(self, image: Image.Image, max_pixels: int | None = None) -> PreparedImage:
        """``image`` -> pixel values ``[3, image_size, image_size]`` float32 (transformers' ``pixel_values``
        of one image), grid `grid`, `num_tokens` tokens. ``max_pixels`` is ignored (one size only)."""
        rgb = image if image.mode == "RGB" else image.convert("RGB")
        side = self.image_size
        resized = rgb.resize((side, side), Image.Resampling(self.resample))
        pixels = channels_first(resized, self.rescale_factor if self.do_rescale else None, self.normalization)
        return PreparedImage.make(np.ascontiguousarray(pixels, dtype=np.float32), self.grid, self.num_tokens)
