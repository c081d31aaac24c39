"""`Gemma3Vision` and `Gemma4Vision`: Gemma 3's and Gemma 4's image sides as the engine uses them
(`atlas_core.model.vision.VisionModel`).

Images are resized to the tower's square and encoded to ``mm_tokens_per_image`` features each; the features
replace the input embeddings of the image tokens after Gemma's ``sqrt(hidden_size)`` embedding scale (as
transformers' ``Gemma3Model`` scatters them into the scaled embeddings), so they enter the decoder unscaled:
`TransformerModel`'s placement as is. Gemma 3 rotates by the token index (no multimodal RoPE), and its
image tokens attend bidirectionally within their image in prefill (`bidirectional_images`).

Gemma 4 resizes each image within a patch budget, keeping its aspect ratio, so images take different numbers
of tokens; its features also replace the scaled embeddings as they are. What else transformers'
``Gemma4Model`` does at image tokens (per-layer inputs read as the pad token's, bidirectional attention on
sliding-window layers only) is `atlas_model_gemma.model.Gemma4Model`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from atlas_core.model.vision import ImageFeatures, PlacedImage, PreparedImage
from atlas_model_gemma.gemma4_image_processor import Gemma4ImageProcessor
from atlas_model_gemma.gemma4_tower import Gemma4VisionTower
from atlas_model_gemma.image_processor import Gemma3ImageProcessor
from atlas_model_gemma.siglip import SiglipTower

if TYPE_CHECKING:
    from PIL.Image import Image


def full_image_sequence(token: Callable[[int], str], boi: int, image: int, eoi: int) -> str:
    """What transformers' ``Gemma3Processor`` writes for one image (``full_image_sequence``), with one image
    token where it writes ``image_seq_length`` of them (the engine expands it to the image's tokens)."""
    return f"\n\n{token(boi)}{token(image)}{token(eoi)}\n\n"


class GemmaVision:
    """What Gemma 3's and Gemma 4's `VisionModel`s share: ``processor(image, max_pixels)`` prepares an image,
    ``tower.encode`` encodes several; ``image_token_id`` marks the feature rows, ``boi_token_id`` /
    ``eoi_token_id`` wrap each image in the prompt; positions are token indices (no multimodal RoPE)."""

    def __init__(
        self,
        processor: Gemma3ImageProcessor | Gemma4ImageProcessor,
        tower: SiglipTower | Gemma4VisionTower,
        image_token_id: int,
        boi_token_id: int,
        eoi_token_id: int,
        *,
        bidirectional_images: bool = True,
    ) -> None:
        self.processor, self.tower = processor, tower
        self.image_token_id, self.boi_token_id, self.eoi_token_id = image_token_id, boi_token_id, eoi_token_id
        self.bidirectional_images = bidirectional_images

    def prepare(self, image: Image, max_pixels: int | None = None) -> PreparedImage:
        return self.processor(image, max_pixels)

    def encode(self, images: Sequence[PreparedImage]) -> list[ImageFeatures]:
        return self.tower.encode(images)

    def rope_positions(self, prompt_ids: Sequence[int], images: Sequence[PlacedImage]) -> None:
        return None  # positions are token indices

    def rope_rows(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError("Gemma has no multimodal RoPE (rope_positions is None)")


class Gemma3Vision(GemmaVision):
    """Gemma 3's `VisionModel` (token ids from config ``image_token_index``, ``boi_token_index`` and
    ``eoi_token_index``); its images always attend to themselves."""

    def rewrite_template_text(self, text: str, token: Callable[[int], str]) -> str:
        """Each begin-of-image token of ``text`` (Gemma 3's chat template writes only that) becomes
        ``"\\n\\n" + boi + image + eoi + "\\n\\n"``, as ``Gemma3Processor`` rewrites it (without pan-and-scan)."""
        boi = token(self.boi_token_id)
        return text.replace(boi, full_image_sequence(token, self.boi_token_id, self.image_token_id, self.eoi_token_id))


class Gemma4Vision(GemmaVision):
    """Gemma 4's `VisionModel` (token ids from config ``image_token_id``, ``boi_token_id`` and
    ``eoi_token_id``); ``bidirectional_images`` when the text config's ``use_bidirectional_attention`` is
    ``"vision"`` (the loader passes it)."""

    def rewrite_template_text(self, text: str, token: Callable[[int], str]) -> str:
        """Each image token of ``text`` (Gemma 4's chat template writes ``<|image|>`` per image) becomes
        ``boi + image + eoi``, as ``Gemma4Processor.replace_image_token`` rewrites it (with one image token
        where it writes the image's soft-token count: the engine expands it)."""
        image = token(self.image_token_id)
        return text.replace(image, token(self.boi_token_id) + image + token(self.eoi_token_id))
