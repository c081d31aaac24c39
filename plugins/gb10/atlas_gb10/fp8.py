"""FP8 E4M3 weights with block scales on the cuda backend, kept as they are in memory.

`CudaBackend.upload_quantized` keeps an ``fp8_e4m3`` `QuantizedWeight` (a linear weight or an expert
bank) on the device as its bytes (uint8) and float32 scales: one byte a weight instead of bf16's two.
The GEMM kernels (``gemm_fp8_*``, ``moe_gemm_fp8_*``) read those bytes and feed the tensor cores
bf16(float(e4m3) * scale), the rounding of dequantizing on the host and uploading as bf16, so a product
over the FP8 weight equals the product over its bf16 dequantization bit for bit (the tests check it).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from atlas_core.backends.base import Array
from atlas_core.weights.quantized import FP8_E4M3, QuantizedWeight

FORMATS = frozenset({FP8_E4M3})
"""The quantized formats the cuda backend executes natively."""


def upload_fp8(backend: Any, weight: QuantizedWeight) -> QuantizedWeight:
    """``weight`` with its elements on the device as uint8 bytes and its scales as float32."""
    data = np.ascontiguousarray(np.asarray(weight.data)).view(np.uint8)
    scales = np.ascontiguousarray(np.asarray(weight.scales, dtype=np.float32))
    return replace(
        weight,
        data=backend.from_numpy(data, dtype=np.dtype(np.uint8)),
        scales=backend.from_numpy(scales, dtype=np.dtype(np.float32)),
    )


def weight_operand(weight: Array | QuantizedWeight) -> tuple[str, tuple[Any, ...], bool]:
    """How a GEMM kernel takes ``weight`` (``[N, K]`` or a bank ``[E, N, K]``): the kernel kind
    (``bf16`` or ``fp8``), its weight arguments, and whether its rows allow the vector loads of the
    ``vec`` kernels (16 bytes of bf16, or 8 FP8 bytes under one scale)."""
    if isinstance(weight, QuantizedWeight):
        if weight.format not in FORMATS:
            raise TypeError(f"cuda backend: no kernel for {weight.format} weights (it executes {sorted(FORMATS)})")
        k = weight.shape[-1]
        bn, bk = weight.block
        aligned = weight.data.data.ptr % 8 == 0 and (bk % 8 == 0 or bk >= k)
        return "fp8", (weight.data, weight.scales, np.int32(bn), np.int32(bk)), aligned
    return "bf16", (weight,), weight.data.ptr % 16 == 0
