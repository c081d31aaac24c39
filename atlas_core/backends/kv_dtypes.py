"""KV cache storage dtypes (the ``kv_cache_dtype`` setting): names, host dtypes, the fp8 quantize /
dequantize reference, and how a setting turns a model's KV layouts into the layouts the cache holds.

``auto`` keeps the backend's activation dtype. ``bf16`` stores bfloat16 K and V. ``fp8`` stores float8
E4M3 (``ml_dtypes.float8_e4m3fn`` on the host) K and V with a float32 scale per layer for K and one
for V: ``stored = E4M3(clip(x / scale, -448, 448))`` (round to nearest even), read back as
``stored * scale``; values beyond ±448·scale saturate. The scales come from the checkpoint when it
has them (`atlas_core.model.kv_scales`); the cache layouts: `atlas_core.batch.kv_cache.kv_storage_layouts`, else 1.0.
"""

from __future__ import annotations

from typing import Literal

import ml_dtypes
import numpy as np

KVCacheDtype = Literal["auto", "bf16", "fp8"]
"""The values of the ``kv_cache_dtype`` setting."""

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
FP8_E4M3_MAX = 448.0
"""The largest finite float8 E4M3 (``e4m3fn``) value: ``x / scale`` beyond ±this saturates."""

KV_DTYPES: dict[str, np.dtype] = {"bf16": BF16, "fp8": FP8_E4M3}
"""Each explicit ``kv_cache_dtype`` name and the host dtype it stores."""


def is_scaled(dtype: np.dtype) -> bool:
    """Whether a cache of ``dtype`` holds scaled values (fp8): writes divide by the layer's scale, reads multiply."""
    return np.dtype(dtype) == FP8_E4M3


def quantize_kv(x: np.ndarray, dtype: np.dtype, scale: float = 1.0) -> np.ndarray:
    """``x`` as stored in a cache of ``dtype``: fp8 divides by ``scale``, clips to ±448 and rounds to the
    nearest E4M3 value; other dtypes round to ``dtype`` (``scale`` unused)."""
    if not is_scaled(dtype):
        return np.asarray(x).astype(dtype)
    scaled = np.asarray(x, dtype=np.float32) / np.float32(scale)
    return np.clip(scaled, -FP8_E4M3_MAX, FP8_E4M3_MAX).astype(FP8_E4M3)


def dequantize_kv(stored: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """float32 values of cache rows ``stored`` (fp8 rows multiplied by ``scale``; others only widened)."""
    stored = np.asarray(stored)
    values = stored.astype(np.float32)
    if is_scaled(stored.dtype) and scale != 1.0:
        values *= np.float32(scale)
    return values


def dtype_label(dtype: np.dtype) -> str:
    """A KV dtype as the messages name it: ``float32``, ``bfloat16``, ``float8_e4m3fn``."""
    return np.dtype(dtype).name
