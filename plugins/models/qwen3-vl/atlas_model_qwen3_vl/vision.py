"""`Qwen3VLVision`: Qwen3-VL's image side as the engine uses it (`atlas_core.model.vision.VisionModel`):
preprocessing, the tower, and interleaved multimodal RoPE (M-RoPE) positions and rotary rows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from atlas_core.model.vision import ImageFeatures, PlacedImage, PreparedImage
from atlas_model_qwen3_vl.processor import ImageProcessor
from atlas_model_qwen3_vl.tower import VisionTower

if TYPE_CHECKING:
    from PIL.Image import Image


def mrope_axes(num_frequencies: int, sections: Sequence[int]) -> np.ndarray:
    """Which position axis (0 = t, 1 = h, 2 = w) rotates each frequency in Qwen3-VL's interleaved layout:
    frequency ``j`` takes h when ``j % 3 == 1`` and ``j < 3 * sections[1]``, w when ``j % 3 == 2`` and
    ``j < 3 * sections[2]``, else t."""
    axes = np.zeros(num_frequencies, dtype=np.int64)
    for axis in (1, 2):
        axes[axis : 3 * sections[axis] : 3] = axis
    return axes


def mrope_positions(num_tokens: int, images: Sequence[PlacedImage], merge_size: int) -> tuple[np.ndarray, int]:
    """``(positions[3, num_tokens], delta)`` of a prompt (transformers' ``get_rope_index``): text tokens
    count on from the previous position on all three axes; an image's tokens sit at ``start`` in t and at
    ``start + row`` / ``start + column`` of its merged grid in h / w, and the text after it starts at
    ``start + max(rows, columns)``. Past the prompt, index ``p`` has position ``p + delta`` on every axis."""
    positions = np.empty((3, num_tokens), dtype=np.int64)
    index = current = 0
    for placed in sorted(images, key=lambda p: p.offset):
        text = placed.offset - index
        positions[:, index : placed.offset] = current + np.arange(text)
        current += text
        t, h, w = placed.image.grid
        rows, cols = h // merge_size, w // merge_size
        grid_t, grid_h, grid_w = np.meshgrid(np.arange(t), np.arange(rows), np.arange(cols), indexing="ij")
        positions[:, placed.offset : placed.end] = current + np.stack([grid_t, grid_h, grid_w]).reshape(3, -1)
        current += max(rows, cols)
        index = placed.end
    positions[:, index:] = current + np.arange(num_tokens - index)
    return positions, int(positions.max()) + 1 - num_tokens


class Qwen3VLVision:
    """Qwen3-VL's `VisionModel`: ``processor`` prepares images, ``tower`` encodes them; ``inv_freq`` and
    ``sections`` are the text model's rotary frequencies and M-RoPE sections, ``attention_factor`` its
    rotary scaling."""

    def __init__(
        self,
        processor: ImageProcessor,
        tower: VisionTower,
        image_token_id: int,
        inv_freq: np.ndarray,
        sections: Sequence[int],
        attention_factor: float = 1.0,
    ) -> None:
        self.processor, self.tower, self.image_token_id = processor, tower, image_token_id
        self.inv_freq = np.asarray(inv_freq, dtype=np.float32)
        self.axes = mrope_axes(len(self.inv_freq), sections)
        self.attention_factor = attention_factor

    bidirectional_images = False

    def rewrite_template_text(self, text: str, token: Callable[[int], str]) -> str:
        return text  # the template writes <|vision_start|><|image_pad|><|vision_end|> itself

    def prepare(self, image: Image, max_pixels: int | None = None) -> PreparedImage:
        return self.processor(image, max_pixels)

    def encode(self, images: Sequence[PreparedImage]) -> list[ImageFeatures]:
        return self.tower.encode(images)

    def rope_positions(self, prompt_ids: Sequence[int], images: Sequence[PlacedImage]) -> tuple[np.ndarray, int]:
        return mrope_positions(len(prompt_ids), images, self.processor.merge_size)

    def rope_rows(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        chosen = positions[self.axes, :].T.astype(np.float32)  # [T, R/2]: each frequency's axis
        angles = chosen * self.inv_freq[None, :]
        factor = np.float32(self.attention_factor)
        return (np.cos(angles) * factor).astype(np.float32), (np.sin(angles) * factor).astype(np.float32)
