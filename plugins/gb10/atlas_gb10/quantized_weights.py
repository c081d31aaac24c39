"""Quantized weights the cuda backend keeps as they are in memory: FP8 E4M3 with block scales, and NVFP4.

`CudaBackend.upload_quantized` keeps an ``fp8_e4m3`` `QuantizedWeight` (a linear weight or an expert bank) on the
device as its bytes (uint8) and float32 scales: one byte a weight instead of bf16's two. The GEMM kernels
(``gemm_fp8_*``, ``moe_gemm_fp8_*``, W8A16) read those bytes, give the tensor cores each element's exact bf16
value, sum each scale block's products apart and add them times the block's scale: the products of the
dequantized weight without rounding it to bf16. Scale blocks must be 32k columns wide or span all of K (every
published layout: 128 x 128 blocks, per channel, per tensor); a weight in other blocks is dequantized at load
instead (`executes_natively`).

An ``nvfp4`` weight keeps its packed rows (`atlas_core.weights.nvfp4`: E2M1 elements two a byte, the E4M3 group
scales and the row's global factor): 0.5625 bytes a weight plus 8 a row. The kernels (``gemm_nvfp4_*``,
``moe_gemm_nvfp4_*``, W4A16, ``kernels/gemm_nvfp4.cuh``) give the tensor cores each element times its group
scale, an exact bf16 value, and multiply each column's sum by its row's factor.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from atlas_core.backends.base import Array
from atlas_core.weights.nvfp4 import NVFP4, row_bytes
from atlas_core.weights.quantized import FP8_E4M3, QuantizedWeight

FORMATS = frozenset({FP8_E4M3, NVFP4})
"""The quantized formats the cuda backend executes natively."""


def executes_natively(weight: QuantizedWeight) -> bool:
    """Whether the kernels take ``weight``: every NVFP4 weight; FP8 in scale blocks 32k columns wide or all of K."""
    if weight.format == NVFP4:
        return True
    bk, k = weight.block[1], weight.shape[-1]
    return weight.format == FP8_E4M3 and (bk % 32 == 0 or bk >= k)


def upload_native(backend: Any, weight: QuantizedWeight) -> QuantizedWeight:
    """``weight`` on the device as the kernels read it: its bytes as uint8, and FP8 scales as float32."""
    data = np.ascontiguousarray(np.asarray(weight.data)).view(np.uint8)
    if weight.format == NVFP4:
        return replace(weight, data=backend.from_numpy(data, dtype=np.dtype(np.uint8)))
    scales = np.ascontiguousarray(np.asarray(weight.scales, dtype=np.float32))
    return replace(
        weight,
        data=backend.from_numpy(data, dtype=np.dtype(np.uint8)),
        scales=backend.from_numpy(scales, dtype=np.dtype(np.float32)),
    )


def weight_operand(weight: Array | QuantizedWeight) -> tuple[str, tuple[Any, ...], bool]:
    """How a GEMM kernel takes ``weight`` (``[N, K]`` or a bank ``[E, N, K]``): the kernel kind (``bf16``,
    ``fp8`` or ``nvfp4``), its weight arguments, and whether its rows allow the vector loads of the ``vec``
    kernels (16 bytes of bf16, 8 FP8 bytes, 4 NVFP4 bytes; the caller checks K % 8 == 0)."""
    if isinstance(weight, QuantizedWeight):
        if not executes_natively(weight):
            raise TypeError(
                f"cuda backend: no kernel for {weight!r} (it executes {sorted(FORMATS)}, FP8 in 32k-wide blocks)"
            )
        if weight.format == NVFP4:
            aligned = row_bytes(weight.shape[-1]) % 4 == 0 and weight.data.data.ptr % 4 == 0
            return "nvfp4", (weight.data,), aligned
        bn, bk = weight.block
        return "fp8", (weight.data, weight.scales, np.int32(bn), np.int32(bk)), weight.data.data.ptr % 8 == 0
    return "bf16", (weight,), weight.data.ptr % 16 == 0
