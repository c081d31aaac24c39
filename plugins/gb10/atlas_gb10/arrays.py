"""Small helpers on the cuda backend's CuPy arrays, shared by its op modules."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
"""The dtype of activations and weights on the cuda backend."""


def null_or(array: Any) -> Any:
    """A kernel pointer argument: the array, or a null pointer for None."""
    return np.uint64(0) if array is None else array


def element_strides(array: Any) -> tuple[int, ...]:
    return tuple(s // array.itemsize for s in array.strides)
