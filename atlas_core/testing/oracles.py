"""Float64 oracles and input builders that several conformance test modules share.

Oracles take and return host float64 arrays and never call a backend (see
`atlas_core.testing.conformance`); builders upload their inputs through a `Case`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from atlas_core.backends.base import Array
from atlas_core.testing.conformance import Case


def oracle_rope(x: np.ndarray, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half on the first ``2 * cos.shape[1]`` dims of every head; the rest is copied."""
    half = cos.shape[1]
    out = x.copy()
    for t, pos in enumerate(positions):
        first, second = x[t, :, :half], x[t, :, half : 2 * half]
        out[t, :, :half] = first * cos[pos] - second * sin[pos]
        out[t, :, half : 2 * half] = second * cos[pos] + first * sin[pos]
    return out


def oracle_argmax(logits: np.ndarray) -> np.ndarray:
    """Per row, the lowest index of the row's maximum."""
    best = np.zeros(len(logits), dtype=np.int64)
    for r, row in enumerate(logits):
        for j in range(1, len(row)):
            if row[j] > row[best[r]]:
                best[r] = j
    return best


MAX_POSITIONS = 64
"""Rows of the tables `rope_tables` builds."""


@dataclass
class RopeTables:
    """RoPE cos/sin tables on the backend (``*_dev``) and as the backend holds them, in float64."""

    cos_dev: Array
    sin_dev: Array
    cos: np.ndarray
    sin: np.ndarray


def rope_tables(case: Case, rotary_dim: int) -> RopeTables:
    """``[MAX_POSITIONS, rotary_dim / 2]`` tables with a random attention factor already applied."""
    inv_freq = 10000.0 ** (-np.arange(0, rotary_dim, 2) / rotary_dim)
    angles = np.arange(MAX_POSITIONS)[:, None] * inv_freq[None, :]
    factor = case.rng.uniform(0.8, 1.3)
    cos_dev, cos = case.upload((np.cos(angles) * factor).astype(np.float32))
    sin_dev, sin = case.upload((np.sin(angles) * factor).astype(np.float32))
    return RopeTables(cos_dev, sin_dev, cos, sin)


def tie_rows(case: Case, rows: int, vocab: int) -> np.ndarray:
    """Small integer logits (exact in every dtype) so the maximum is shared by several ids."""
    logits = case.rng.integers(-3, 3, size=(rows, vocab)).astype(np.float32)
    for row in logits:  # the row maximum at two far-apart ids at least
        row[case.rng.integers(0, vocab // 2)] = row[case.rng.integers(vocab // 2, vocab)] = 3.0
    return logits
