"""Quantized weights the cuda backend keeps as they are in memory: FP8 E4M3 with block scales, NVFP4, GGUF Q8_0.

`CudaBackend.upload_quantized` keeps an ``fp8_e4m3`` `QuantizedWeight` (a linear weight or an expert bank) on the
device as its bytes (uint8) and float32 scales: one byte a weight instead of bf16's two. The GEMM kernels
(``gemm_fp8_*``, ``moe_gemm_fp8_*``, W8A16) read those bytes, give the tensor cores each element's exact bf16
value, sum each scale block's products apart and add them times the block's scale: the products of the
dequantized weight without rounding it to bf16. Its rows are reordered at upload so that a kernel lane loads
its bytes of two chunks at once (`pair_fp8_chunks`). Scale blocks must be 64k columns wide or span all of K
(every published layout: 128 x 128 blocks, per channel, per tensor); a weight in other blocks is dequantized at
load instead (`executes_natively`).

An ``nvfp4`` weight keeps its packed rows (`atlas_core.weights.nvfp4`: E2M1 elements two a byte, the E4M3 group
scales and the row's global factor): 0.5625 bytes a weight plus 8 a row (padded to 16 bytes on the device), its
elements reordered at upload for the kernels' loads (`nvfp4_device_rows`). The kernels (``gemm_nvfp4_*``,
``moe_gemm_nvfp4_*``, W4A16, ``kernels/gemm_nvfp4.cuh``) give the tensor cores each element times its group scale,
an exact bf16 value, and multiply each column's sum by its row's factor. A ``gguf_q8_0`` weight keeps
llama.cpp's bytes (an f16 scale and 32 int8 codes a block), codes and scales apart on the device
(`q8_0_device_rows`): the kernels (``gemm_gguf_q8_0_*``,
``moe_gemm_gguf_q8_0_*``, ``kernels/gemm_gguf.cuh``) sum each block's products apart and add them times its scale.
So do Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K weights (``kernels/gemm_gguf_blocks.cuh``, one module each).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from atlas_core.backends.base import Array
from atlas_core.weights.gguf_quantized import FORMATS as GGUF_FORMATS
from atlas_core.weights.nvfp4 import NVFP4, row_bytes
from atlas_core.weights.quantized import FP8_E4M3, QuantizedWeight, padded_row_bytes

GGUF_Q8_0 = "gguf_q8_0"
"""`atlas_core.weights.gguf_quantized`'s format name of llama.cpp's Q8_0 blocks."""
GGUF_BLOCK_FORMATS = frozenset(name for name in GGUF_FORMATS.values() if name != GGUF_Q8_0)
"""The other GGUF block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K): each format's kernels are modules of
their own (the registry's ``gemm`` and ``moe`` entries of that dtype, ``kernels/gemm_gguf_blocks.cuh``)."""
GGUF_APART = {"gguf_q4_0": (0, 2), "gguf_q4_1": (0, 4), "gguf_q5_0": (2, 2), "gguf_q5_1": (4, 4)}
"""The 32-element GGUF formats laid out apart at upload (`gguf_device_rows`): format -> (offset of the block's 4
high-bit bytes, 0 without them; bytes of its coefficients, d or d and m, at the block's start)."""
ROW_FORMATS = frozenset({NVFP4, GGUF_Q8_0, *GGUF_BLOCK_FORMATS})
"""Formats whose kernels (``gemm_<format>_*``) take the weight as rows of bytes alone (no separate scales); some are
laid out for the kernels at upload (`upload_native`)."""
FORMATS = frozenset({FP8_E4M3, *ROW_FORMATS})
"""The quantized formats the cuda backend executes natively."""


def executes_natively(weight: QuantizedWeight) -> bool:
    """Whether the kernels take ``weight``: every NVFP4 and GGUF block weight; FP8 in scale blocks 64k columns wide
    or all of K (a lane loads two 32-wide chunks at once, and both must share their scale)."""
    if weight.format in ROW_FORMATS:
        return True
    bk, k = weight.block[1], weight.shape[-1]
    return weight.format == FP8_E4M3 and (bk % 64 == 0 or bk >= k)


def upload_native(backend: Any, weight: QuantizedWeight) -> QuantizedWeight:
    """``weight`` on the device as the kernels read it: its bytes as uint8, and FP8 scales as float32."""
    data = np.ascontiguousarray(np.asarray(weight.data)).view(np.uint8)
    if weight.format == NVFP4:
        data = nvfp4_device_rows(data, weight.shape[-1])
    elif weight.format == FP8_E4M3:
        data = pair_fp8_chunks(data)
    elif weight.format == GGUF_Q8_0:
        data = q8_0_device_rows(data)
    elif weight.format in GGUF_APART:
        data = gguf_device_rows(data, weight.format)
    if weight.format in ROW_FORMATS:
        return replace(weight, data=backend.from_numpy(data, dtype=np.dtype(np.uint8)))
    scales = np.ascontiguousarray(np.asarray(weight.scales, dtype=np.float32))
    return replace(
        weight,
        data=backend.from_numpy(data, dtype=np.dtype(np.uint8)),
        scales=backend.from_numpy(scales, dtype=np.dtype(np.float32)),
    )


def pair_fp8_chunks(data: np.ndarray) -> np.ndarray:
    """FP8 rows (uint8 ``[..., K]``) with each full 64-byte group of two 32-element chunks laid out lane by lane:
    bytes 8q .. 8q + 7 of the first chunk, then those of the second (q = 0 .. 3), so that one 16-byte load gives
    a kernel lane its bytes of both (``fp8_pair_in_rows`` in ``kernels/gemm_fp8.cuh``); a last group shorter than 64
    bytes unchanged. A new array."""
    rows = np.array(data, dtype=np.uint8, copy=True)
    full = rows.shape[-1] // 64 * 64
    groups = rows[..., :full].reshape(*rows.shape[:-1], -1, 2, 4, 8)
    rows[..., :full] = groups.swapaxes(-3, -2).reshape(*rows.shape[:-1], full)
    return rows


def q8_0_device_rows(data: np.ndarray) -> np.ndarray:
    """GGUF Q8_0 rows (uint8 ``[..., K / 32 * 34]``: blocks of an f16 scale and 32 int8 codes) as
    ``kernels/gemm_gguf.cuh`` reads them, the same bytes apart: the K codes (full 64-byte groups laid out as
    `pair_fp8_chunks` lays out FP8 rows), then the K / 32 scales, zero-padded to a multiple of 16 bytes. A new
    array."""
    blocks = np.asarray(data, dtype=np.uint8).reshape(*data.shape[:-1], -1, 34)
    lead, columns = blocks.shape[:-2], blocks.shape[-2] * 32
    return padded_rows(lead, pair_fp8_chunks(blocks[..., 2:].reshape(*lead, columns)), blocks[..., :2])


def gguf_device_rows(data: np.ndarray, fmt: str) -> np.ndarray:
    """Q4_0, Q4_1, Q5_0 or Q5_1 rows (uint8 ``[..., blocks * block bytes]``) as ``kernels/gemm_gguf_blocks.cuh``
    reads them, the same bytes apart: the blocks' 16 code bytes each, then (Q5) their 4 high-bit bytes each, then
    their coefficients (d, or d and m), zero-padded to a multiple of 16 bytes. A new array."""
    high_at, coefficients = GGUF_APART[fmt]
    size = 16 + coefficients + (4 if high_at else 0)
    blocks = np.asarray(data, dtype=np.uint8).reshape(*data.shape[:-1], -1, size)
    parts = [
        blocks[..., size - 16 :],
        *([blocks[..., high_at : high_at + 4]] if high_at else []),
        blocks[..., :coefficients],
    ]
    return padded_rows(blocks.shape[:-2], *parts)


WORD_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""The element in each nibble of an interleaved NVFP4 word: nibble t holds element 2t, nibble t + 4 element 2t + 1."""


def nvfp4_device_rows(data: np.ndarray, columns: int) -> np.ndarray:
    """NVFP4 rows (uint8 ``[..., row_bytes(columns)]``) as ``kernels/gemm_nvfp4.cuh`` reads them: words
    interleaved (`interleave_nvfp4`); in each full group of four 32-element chunks, each kernel lane's words of the
    four chunks made consecutive (lane q's 16 bytes from 16q) and so its four group scales (from 4 (q / 2)); the
    rest of the row unchanged; rows zero-padded to `device_row_bytes`. A new array."""
    rows = interleave_nvfp4(data, columns)
    lead, full = rows.shape[:-1], columns // 128 * 128
    codes = rows[..., : full // 2].reshape(*lead, -1, 4, 4, 4)  # [group, chunk, lane, byte]
    rows[..., : full // 2] = codes.swapaxes(-3, -2).reshape(*lead, full // 2)
    scale_bytes = slice(columns // 2, columns // 2 + full // 16)
    scales = rows[..., scale_bytes].reshape(*lead, -1, 4, 2)  # [group, chunk, lane pair]
    rows[..., scale_bytes] = scales.swapaxes(-2, -1).reshape(*lead, full // 16)
    return padded_rows(lead, rows)


def padded_rows(lead: tuple[int, ...], *parts: np.ndarray) -> np.ndarray:
    """Rows (leading axes ``lead``) of each of ``parts``' bytes after those axes, one part after the other,
    zero-padded to `padded_row_bytes` (rows the kernels load 16 bytes at a time). A new array."""
    flat = [part.reshape(*lead, -1) for part in parts]
    width = sum(part.shape[-1] for part in flat)
    rows = np.zeros((*lead, padded_row_bytes(width)), dtype=np.uint8)
    rows[..., :width] = np.concatenate(flat, axis=-1)
    return rows


def device_row_bytes(columns: int) -> int:
    """An NVFP4 row's bytes on the device: `row_bytes` padded to a multiple of 16, so that rows allow 16-byte loads
    (``nvfp4_row_bytes`` in ``kernels/gemm_nvfp4.cuh``)."""
    return padded_row_bytes(row_bytes(columns))


def interleave_nvfp4(data: np.ndarray, columns: int) -> np.ndarray:
    """NVFP4 rows (uint8 ``[..., row_bytes(columns)]``) with each 4-byte word of packed elements (8 columns, two a
    byte, the even one in the low nibble) reordered as `WORD_ORDER` says, the order in which the kernels take pairs
    apart with one shift and two masks; the group scales and factors unchanged. A new array."""
    rows = np.array(data, dtype=np.uint8, copy=True)
    words = rows[..., : columns // 2].reshape(*rows.shape[:-1], columns // 8, 4)
    elements = np.stack([words & 0x0F, words >> 4], axis=-1).reshape(*words.shape[:-1], 8)
    nibbles = elements[..., list(WORD_ORDER)]
    rows[..., : columns // 2] = (nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)).reshape(*rows.shape[:-1], -1)
    return rows


def weight_operand(weight: Array | QuantizedWeight) -> tuple[str, tuple[Any, ...], bool]:
    """How a GEMM kernel takes ``weight`` (``[N, K]`` or a bank ``[E, N, K]``): the kernel kind (``bf16``,
    ``fp8``, ``nvfp4`` or ``gguf_q8_0``), its weight arguments, and whether its rows allow the vector loads of the
    ``vec`` kernels (16 bytes of bf16, of FP8 (K % 16 == 0) or of NVFP4's and Q8_0's padded rows; the 32-element
    GGUF formats' padded rows; the K-quants read as their blocks allow, always aligned; the caller checks K % 8 ==
    0)."""
    if isinstance(weight, QuantizedWeight):
        if not executes_natively(weight):
            raise TypeError(
                f"cuda backend: no kernel for {weight!r} (it executes {sorted(FORMATS)}, FP8 in 64k-wide blocks)"
            )
        if weight.format in ROW_FORMATS:
            aligned = weight.format not in (NVFP4, GGUF_Q8_0, *GGUF_APART) or weight.data.data.ptr % 16 == 0
            return weight.format, (weight.data,), aligned
        bn, bk = weight.block
        aligned = weight.data.data.ptr % 16 == 0 and weight.shape[-1] % 16 == 0
        return "fp8", (weight.data, weight.scales, np.int32(bn), np.int32(bk)), aligned
    return "bf16", (weight,), weight.data.ptr % 16 == 0


LOW8_ROWS = 8
"""Products of at most this many rows take the quantized kinds' ``vec8`` kernels (``VEC_LOW8`` in
``kernels/gemm_core.cuh``): the same bits; with two n-tiles a block, the weight's columns are the mma's rows (a pair
of n-tiles per mma step, no fragments of zero rows)."""


def gemm_loads(kind: str, vec: bool, rows: int) -> str:
    """The load-mode suffix of the ``gemm_<kind>_m*_n*`` kernel for a product of ``rows`` rows: ``any`` (unaligned
    operands), ``vec8`` (a quantized kind, at most `LOW8_ROWS` rows; decode tiles only, as `CudaBackend.gemm_tile`
    picks for them) or ``vec``."""
    if not vec:
        return "any"
    return "vec8" if kind != "bf16" and rows <= LOW8_ROWS else "vec"


def gemm_module(kind: str) -> str:
    """The registry dtype of the module holding the ``gemm_<kind>_*`` (and ``moe_gemm_<kind>_*``) kernels: the GGUF
    block formats each have their own (built with their ``GGUF_TYPE``), every other kind is in the ``bf16`` one."""
    return kind if kind in GGUF_BLOCK_FORMATS else "bf16"
