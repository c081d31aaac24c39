"""A request's images in the engine: their placement in the prompt, multimodal RoPE positions, prefix-cache
keys and encoder features (`RequestImages`), and what one forward needs of them (`BatchImages`).

The encoder runs once per image: `BatchImages.finish` encodes, in one call, every image whose placeholder
rows the batch holds and whose features the request does not have yet, and the request keeps them (on
the host) until it is dropped, so later prefill chunks, forks and recomputation after preemption reuse them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from atlas_core.backends.base import Array, Backend
from atlas_core.batch.forward_batch import VisualRows
from atlas_core.model.vision import PlacedImage, PreparedImage, VisionModel, cache_keys, expand_placeholders


@dataclass
class RequestImages:
    """The images of one request. ``positions[3, L]`` and ``delta``: the prompt's multimodal RoPE positions
    (None: the model rotates by token index); ``cache_prefix``: the prompt's prefix-cache keys
    (`atlas_core.model.vision.cache_keys`); ``features[k]``: image k's encoder output, once computed, as
    host arrays ``(embeds, deepstack)``."""

    placed: list[PlacedImage]
    positions: np.ndarray | None
    delta: int
    cache_prefix: list[int]
    features: dict[int, tuple[np.ndarray, list[np.ndarray]]] = field(default_factory=dict)
    bidirectional: bool = False
    """Each image's tokens attend to the whole image (`VisionModel.bidirectional_images`)."""

    @classmethod
    def prepare(
        cls, vision: VisionModel, prompt_ids: Sequence[int], images: Sequence[PreparedImage]
    ) -> tuple[list[int], RequestImages]:
        """Expand ``prompt_ids``'s placeholders for ``images`` -> ``(prompt ids, the request's images)``."""
        ids, placed = expand_placeholders(prompt_ids, images, vision.image_token_id)
        rope = vision.rope_positions(ids, placed)
        positions, delta = (None, 0) if rope is None else rope
        return ids, cls(placed, positions, delta, cache_keys(ids, placed), bidirectional=vision.bidirectional_images)

    def chunk_tokens(self, start: int, count: int) -> int:
        """How many of the ``count`` tokens from ``start`` a prefill chunk may take: with bidirectional
        images, a chunk never ends inside an image (its earlier tokens could not see the later ones). It
        ends before the image, or, when it starts inside or at it, runs to the image's end (past ``count``
        when the image is longer)."""
        if not self.bidirectional:
            return count
        end = start + count
        for placed in self.placed:
            if placed.offset < end < placed.end:
                return placed.offset - start if placed.offset > start else placed.end - start
        return count

    def visible_end(self, start: int, end: int) -> np.ndarray | None:
        """For tokens ``start .. end - 1``: the end (exclusive) of the keys each one attends to, ``index + 1``
        for causal rows and the image's end for a bidirectional image's rows; None when no row looks
        ahead."""
        if not self.bidirectional:
            return None
        limits = np.arange(start + 1, end + 1, dtype=np.int32)
        ahead = False
        for placed in self.placed:
            first, stop = max(start, placed.offset), min(end, placed.end)
            if first < stop:
                limits[first - start : stop - start] = placed.end
                ahead = True
        return limits if ahead else None

    def axes_positions(self, start: int, end: int) -> np.ndarray:
        """Positions ``[3, end - start]`` of tokens ``start .. end - 1``: the prompt's multimodal ones, then
        ``index + delta`` past the prompt."""
        if self.positions is None:
            return np.broadcast_to(np.arange(start, end), (3, end - start))
        length = self.positions.shape[1]
        inside = self.positions[:, min(start, length) : min(end, length)]
        past = np.arange(max(start, length), end) + self.delta
        return np.concatenate([inside, np.broadcast_to(past, (3, len(past)))], axis=1)


@dataclass
class _Wanted:
    images: RequestImages
    index: int  # image k of the request
    first: int  # first token of the image in this batch (relative to the image)
    stop: int
    row: int  # the batch row of token ``first``


class BatchImages:
    """What one forward needs of its sequences' images, gathered while the runner lays out its tokens."""

    def __init__(self, vision: VisionModel | None) -> None:
        self.vision = vision
        self.axes: dict[int, np.ndarray] = {}  # multimodal positions of the spans of requests with images
        self.wanted: list[_Wanted] = []
        self.spans: list[tuple[int, int]] = []
        self.limits: dict[int, np.ndarray] = {}

    def positions(self, images: RequestImages | None, start: int, end: int, first_row: int) -> np.ndarray:
        """The positions ``[end - start]`` (int32) of a sequence's tokens ``start .. end - 1``, laid out from
        batch row ``first_row``; records the image rows among them and how far each row attends."""
        self.spans.append((start, end))
        if images is None:
            return np.arange(start, end, dtype=np.int32)
        limits = images.visible_end(start, end)
        if limits is not None:
            self.limits[len(self.spans) - 1] = limits
        axes = images.axes_positions(start, end)
        self.axes[len(self.spans) - 1] = axes
        for k, placed in enumerate(images.placed):
            first, stop = max(start, placed.offset), min(end, placed.end)
            if first < stop:
                self.wanted.append(
                    _Wanted(images, k, first - placed.offset, stop - placed.offset, first_row + first - start)
                )
        return axes[0].astype(np.int32)

    def visible_end(self) -> np.ndarray | None:
        """`AttentionMetadata.visible_end` of the batch (host int32 ``[T]``, rows in the order `positions`
        was called); None when every row is causal."""
        if not self.limits:
            return None
        return np.concatenate(
            [
                self.limits.get(i, np.arange(start + 1, end + 1, dtype=np.int32))
                for i, (start, end) in enumerate(self.spans)
            ]
        )

    def finish(self, backend: Backend) -> tuple[VisualRows | None, tuple[Array, Array, Array] | None]:
        """``(visual rows, M-RoPE rows)`` of the batch: both None when it holds no image token."""
        if not self.wanted:
            return None, None
        assert self.vision is not None  # requests carry images only on models with a vision side
        self._encode(backend)
        rows = np.concatenate([np.arange(w.row, w.row + w.stop - w.first) for w in self.wanted]).astype(np.int32)
        parts = [w.images.features[w.index] for w in self.wanted]
        cut = [slice(w.first, w.stop) for w in self.wanted]
        embeds = np.concatenate([embeds[s] for (embeds, _), s in zip(parts, cut, strict=True)])
        depth = len(parts[0][1])
        deepstack = [
            backend.from_numpy(np.concatenate([stack[i][s] for (_, stack), s in zip(parts, cut, strict=True)]))
            for i in range(depth)
        ]
        visual = VisualRows(backend.from_numpy(rows), backend.from_numpy(embeds), deepstack)
        rope = None
        positions = np.concatenate(
            [
                self.axes[i] if i in self.axes else np.broadcast_to(np.arange(start, end), (3, end - start))
                for i, (start, end) in enumerate(self.spans)
            ],
            axis=1,
        )
        if any(w.images.positions is not None for w in self.wanted):
            cos, sin = self.vision.rope_rows(positions)
            float32 = np.dtype(np.float32)
            rope = (
                backend.from_numpy(cos, dtype=float32),
                backend.from_numpy(sin, dtype=float32),
                backend.from_numpy(np.arange(positions.shape[1], dtype=np.int32)),
            )
        return visual, rope

    def _encode(self, backend: Backend) -> None:
        """Run the encoder once over every wanted image that has no features yet."""
        assert self.vision is not None
        missing: dict[tuple[int, int], tuple[RequestImages, int]] = {}
        for w in self.wanted:
            if w.index not in w.images.features:
                missing[(id(w.images), w.index)] = (w.images, w.index)
        if not missing:
            return
        todo = list(missing.values())
        features = self.vision.encode([images.placed[k].image for images, k in todo])
        for (images, k), feature in zip(todo, features, strict=True):
            images.features[k] = (backend.to_numpy(feature.embeds), [backend.to_numpy(d) for d in feature.deepstack])
