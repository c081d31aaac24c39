"""Launching the row-wise elementwise kernels of ``elementwise.cu`` (``MAP_KERNEL``): ``out = op(x, y)`` over
rows with their own strides, shared by the op groups made of such maps (``gemma``, ``vision``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from atlas_gb10.arrays import BF16, null_or

BLOCKS_PER_SM = 8
"""Grid-stride launches use at most this many 256-thread blocks per SM."""


def as_rows(backend: Any, a: Any, cols: int) -> Any:
    """``a`` as ``[rows, cols]`` with contiguous rows: a view where its strides allow, else a copy."""
    a = backend.contiguous_rows(a) if a.ndim else a.reshape(1)
    return a.reshape(-1, cols)


def row_stride(rows: Any) -> int:
    return int(rows.strides[0] // rows.itemsize)


def grid_blocks(backend: Any, total: int) -> int:
    """256-thread blocks of a grid-stride launch over ``total`` elements."""
    return min(math.ceil(total / 256), BLOCKS_PER_SM * max(1, backend.profile.sm_count))


def map_rows(backend: Any, kernel: str, x: Any, y: Any | None, value: float) -> Any:
    """``out = op(x, y)`` elementwise through ``kernel`` with the float argument ``value``: a new contiguous
    bf16 array in ``x``'s shape (``y``, when given, has the same shape)."""
    backend.require_bf16(kernel, x, y)
    out = backend.cp.empty(x.shape, dtype=BF16)
    if out.size == 0:
        return out
    cols = int(x.shape[-1]) if x.ndim else 1
    rows_x, rows_y = as_rows(backend, x, cols), None if y is None else as_rows(backend, y, cols)
    total = out.size
    backend.kernels.function("elementwise", kernel)(
        (grid_blocks(backend, total),),
        (256,),
        (
            rows_x,
            np.int64(row_stride(rows_x)),
            null_or(rows_y),
            np.int64(0 if rows_y is None else row_stride(rows_y)),
            out,
            np.int32(cols),
            np.int64(total // cols),
            np.float32(value),
        ),
    )
    return out
