"""Test support for KV storage tiers (`atlas_core.storage`): records whose bytes cover every bit pattern."""

from __future__ import annotations

import numpy as np

from atlas_core.storage import RecordFormat


def random_records(format: RecordFormat, count: int, seed: int = 0) -> list[np.ndarray]:
    """``count`` records of ``format`` made of random bytes, so that floating-point entries hold every bit
    pattern class (NaN payloads, infinities, subnormals): a tier must return them bit-exact."""
    rng = np.random.default_rng(seed)
    return [
        rng.integers(0, 256, (count, *shape, np.dtype(dtype).itemsize), dtype=np.uint8)
        .view(dtype)
        .reshape(count, *shape)
        for shape, dtype in format.arrays
    ]
