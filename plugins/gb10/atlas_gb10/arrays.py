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


FP8_CACHE = np.dtype(np.uint8)
"""How the cuda backend holds fp8 (E4M3) KV caches: as their bytes (`CudaBackend.zeros`); the kernels read and
write E4M3 (``kernels/fp8.cuh``)."""


def loads_16_bytes(x: Any, ldx: int, k: int, weight_aligned: bool) -> bool:
    """Whether a product over ``k`` may read its x rows (row stride ``ldx`` elements) and its weight (aligned as
    ``weight_aligned`` says) 16 bytes at a time: the products' ``vec`` kernels, TMA included."""
    return k % 8 == 0 and ldx % 8 == 0 and x.data.ptr % 16 == 0 and weight_aligned


def cache_kind(op: str, k_cache: Any, v_cache: Any, kv_scales: tuple[float, float] | None) -> str:
    """The kernel dtype of a KV cache pair: ``fp8`` for E4M3 caches given their layer's ``(k_scale, v_scale)``,
    ``bf16`` for bf16 caches given none; a TypeError naming ``op`` otherwise."""
    want = FP8_CACHE if kv_scales is not None else BF16
    for cache in (k_cache, v_cache):
        if cache.dtype != want:
            stored = "fp8 E4M3 bytes (uint8) with scales" if kv_scales is not None else "bfloat16 without scales"
            raise TypeError(f"cuda backend: {op} takes KV caches of {stored}, got {cache.dtype}")
    return "fp8" if kv_scales is not None else "bf16"
