"""Image input of vision-language models: what a family's vision side offers the engine (`VisionModel`),
and the prepared images and features that pass between them.

A family that reads images sets ``TransformerModel.vision`` to its `VisionModel`. The engine prepares each
image of a request once (`VisionModel.prepare`: the model's own preprocessing), expands the prompt's image
placeholders to the image's token count (`expand_placeholders`), runs the encoder once per image
(`VisionModel.encode`, several images at once) and places the features into the rows of the placeholder
tokens (`atlas_core.batch.forward_batch.VisualRows`); models with multimodal RoPE get per-token rotary
rows for batches holding image tokens (`VisionModel.rope_positions`, `VisionModel.rope_rows`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from atlas_core.backends.base import Array
from atlas_core.errors import InvalidRequestError

if TYPE_CHECKING:
    from PIL.Image import Image


@dataclass(frozen=True)
class PreparedImage:
    """One image after the model's preprocessing: ``pixel_values`` (the encoder's input, e.g. flattened
    patches ``[patches, patch_dim]`` float32), its ``grid`` (e.g. ``(t, h, w)`` in patches), the number of
    placeholder tokens it takes in the prompt, and ``digest``, the SHA-256 of pixel values and grid (two
    images share it only when the encoder sees the same input)."""

    pixel_values: np.ndarray
    grid: tuple[int, ...]
    num_tokens: int
    digest: bytes = field(default=b"", compare=False)

    @classmethod
    def make(
        cls, pixel_values: np.ndarray, grid: tuple[int, ...], num_tokens: int, identity: np.ndarray | None = None
    ) -> PreparedImage:
        """A prepared image with its digest computed over ``identity`` (an array that, for this model's
        processor, determines ``pixel_values``: the resized 8-bit image, say, smaller to hash) or, without one,
        over ``pixel_values``, and the grid."""
        hashed = np.ascontiguousarray(pixel_values if identity is None else identity)
        digest = hashlib.sha256(hashed.data.cast("B"))
        digest.update(f"{hashed.dtype.str}{hashed.shape}{tuple(int(g) for g in grid)}".encode())
        return cls(pixel_values, tuple(int(g) for g in grid), num_tokens, digest.digest())


@dataclass(frozen=True)
class PlacedImage:
    """A prepared image and the prompt index of its first placeholder token (its tokens are
    ``offset .. offset + image.num_tokens - 1``)."""

    image: PreparedImage
    offset: int

    @property
    def end(self) -> int:
        return self.offset + self.image.num_tokens


@dataclass
class ImageFeatures:
    """The encoder's output for one image: ``embeds[num_tokens, H]`` (the placeholder tokens' input
    embeddings) and ``deepstack[i][num_tokens, H]``, added after decoder layer ``i`` (empty when the
    tower feeds no deepstack features)."""

    embeds: Array
    deepstack: list[Array]


class VisionModel(Protocol):
    """The vision side of a vision-language model, as the engine uses it."""

    image_token_id: int
    """The placeholder token whose rows take an image's features."""

    bidirectional_images: bool
    """True: each image's tokens attend to every token of the same image (and causally to what precedes
    it), as Gemma 3 / 4 do in prefill; the scheduler then never cuts an image across prefill chunks. False:
    causal attention throughout (Qwen)."""

    def rewrite_template_text(self, text: str, token: Callable[[int], str]) -> str:
        """The rendered chat ``text`` as the model's own processor rewrites it before tokenization (Gemma 3
        wraps each begin-of-image token the template writes into the full image sequence); ``token(id)``
        is a special token's string. Models whose templates write the final placeholders return ``text``."""
        ...

    def prepare(self, image: Image, max_pixels: int | None = None) -> PreparedImage:
        """``image`` (RGB) resized, normalised and patched as the model's processor does it, within the
        model's pixel budget and at most ``max_pixels`` (None: the model's own budget)."""
        ...

    def encode(self, images: Sequence[PreparedImage]) -> list[ImageFeatures]:
        """Run the vision tower over ``images`` (one call for all of them) -> each image's features."""
        ...

    def rope_positions(self, prompt_ids: Sequence[int], images: Sequence[PlacedImage]) -> tuple[np.ndarray, int] | None:
        """Multimodal RoPE positions of a prompt with images: ``(positions[3, len(prompt_ids)], delta)``,
        where a token at index ``p`` past the prompt has position ``p + delta`` on every axis. None: the
        model rotates by the token index (no multimodal RoPE)."""
        ...

    def rope_rows(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(cos, sin)`` rows ``[T, R/2]`` float32 for multimodal positions ``[3, T]``."""
        ...


def expand_placeholders(
    prompt_ids: Sequence[int], images: Sequence[PreparedImage], image_token_id: int
) -> tuple[list[int], list[PlacedImage]]:
    """Give each image its placeholder tokens: the k-th maximal run of ``image_token_id`` in ``prompt_ids``
    belongs to image k and is either one token (expanded to ``num_tokens`` copies, as chat templates write
    it) or already ``num_tokens`` long. `InvalidRequestError` when runs and images do not pair up."""
    runs: list[tuple[int, int]] = []
    for index, token in enumerate(prompt_ids):
        if token != image_token_id:
            continue
        if runs and runs[-1][1] == index:
            runs[-1] = (runs[-1][0], index + 1)
        else:
            runs.append((index, index + 1))
    if len(runs) != len(images):
        raise InvalidRequestError(
            f"the prompt has {len(runs)} image placeholder(s) (token {image_token_id}) for {len(images)} image(s)"
        )
    ids: list[int] = []
    placed: list[PlacedImage] = []
    previous = 0
    for k, ((start, stop), image) in enumerate(zip(runs, images, strict=True)):
        if stop - start not in (1, image.num_tokens):
            raise InvalidRequestError(
                f"image {k}'s placeholder is {stop - start} tokens long; it takes 1 (expanded) or {image.num_tokens}"
            )
        ids.extend(prompt_ids[previous:start])
        placed.append(PlacedImage(image, len(ids)))
        ids.extend([image_token_id] * image.num_tokens)
        previous = stop
    ids.extend(prompt_ids[previous:])
    return ids, placed


def cache_keys(prompt_ids: Sequence[int], images: Sequence[PlacedImage]) -> list[int]:
    """``prompt_ids`` with each image's placeholder tokens replaced by keys derived from its digest and the
    token's place in the image (negative, so never a token id; 63 bits, so they fit int64 records): the ids
    the prefix cache files blocks under, so the same image with the same text hits and another image never
    does."""
    keys = list(prompt_ids)
    for placed in images:
        base = int.from_bytes(placed.image.digest[:8], "little") >> 2
        for i in range(placed.image.num_tokens):
            keys[placed.offset + i] = -1 - ((base + i) % (1 << 62))
    return keys
