"""Images that attend to themselves bidirectionally (Gemma 3 / 4): prefill chunks never end inside one
(`RequestImages.chunk_tokens`, used by the scheduler), and each image row's attention reaches the image's
end (`RequestImages.visible_end`, gathered per batch by `BatchImages`). The attention kernels' side is in
the attention conformance tests."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.engine.images import BatchImages, RequestImages
from atlas_core.model.vision import PlacedImage, PreparedImage


def images(*spans: tuple[int, int], bidirectional: bool = True) -> RequestImages:
    """A request whose images take prompt tokens ``offset .. offset + length - 1`` for each span."""
    placed = [PlacedImage(PreparedImage.make(np.zeros((1, 1), np.float32), (1, 1, 1), n), at) for at, n in spans]
    return RequestImages(placed, None, 0, [], bidirectional=bidirectional)


@pytest.mark.parametrize(
    ("start", "count", "expected"),
    [
        (0, 5, 5),  # ends before the first image
        (0, 6, 5),  # would end inside it: stops before it
        (0, 10, 10),  # ends right at its end
        (5, 2, 5),  # starts at the image: takes all of it, past the budget
        (7, 1, 3),  # starts inside it (a cached prefix ended there): runs to its end
        (10, 16, 14),  # ends inside the second image: stops before it
        (24, 1, 4),  # the second image whole
        (28, 4, 4),  # after both
    ],
)
def test_chunks_never_end_inside_an_image(start: int, count: int, expected: int) -> None:
    request = images((5, 5), (24, 4))
    assert request.chunk_tokens(start, count) == expected
    assert images((5, 5), (24, 4), bidirectional=False).chunk_tokens(start, count) == count


def test_image_rows_see_to_the_image_end() -> None:
    request = images((2, 3), (8, 2))
    assert request.visible_end(0, 2) is None  # text only: causal
    assert request.visible_end(0, 12).tolist() == [1, 2, 5, 5, 5, 6, 7, 8, 10, 10, 11, 12]
    assert request.visible_end(3, 6).tolist() == [5, 5, 6]
    assert images((2, 3), bidirectional=False).visible_end(0, 6) is None


def test_batch_gathers_rows_in_order_and_stays_causal_without_look_ahead() -> None:
    text_only = BatchImages(None)
    text_only.positions(None, 4, 7, 0)
    text_only.positions(images((0, 2), bidirectional=False), 0, 3, 3)
    assert text_only.visible_end() is None
    batch = BatchImages(None)
    batch.positions(None, 9, 10, 0)  # a decode token
    batch.positions(images((1, 3)), 0, 5, 1)
    visible = batch.visible_end()
    assert visible is not None
    assert visible.dtype == np.int32
    assert visible.tolist() == [10, 1, 4, 4, 4, 5]
