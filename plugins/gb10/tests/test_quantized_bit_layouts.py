"""The bit manipulations the quantized GEMM kernels use to turn stored bytes into bf16 operands, replayed in NumPy
without a GPU: every E4M3 byte (``fp8.cuh``: e4m3x4_to_bf16x2), every int8 code (``gemm_gguf.cuh``:
i8x4_to_bf16x2), and every E2M1 code times every E4M3 scale in the word order `interleave_nvfp4` gives NVFP4 rows
(``gemm_nvfp4.cuh``: e2m1_pair_scaled). The GPU suite checks the kernels' products themselves."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from atlas_gb10.quantized_weights import interleave_nvfp4

from atlas_core.weights.nvfp4 import nvfp4_from_float, row_bytes, split_rows, unpack_e2m1

U32 = np.uint32


def bf16_halves(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The low and high bf16 halves of 32-bit words as float64."""
    words = np.asarray(words, dtype=U32)
    lo = (words & 0xFFFF).astype(np.uint16).view(ml_dtypes.bfloat16)
    hi = (words >> 16).astype(np.uint16).view(ml_dtypes.bfloat16)
    return lo.astype(np.float64), hi.astype(np.float64)


def byte_perm(x: np.ndarray, y: np.ndarray, selector: int) -> np.ndarray:
    """CUDA's __byte_perm: byte i of the result is byte (selector nibble i) of the 8 bytes of (x, y)."""
    pool = (np.asarray(x, dtype=np.uint64) | (np.asarray(y, dtype=np.uint64) << np.uint64(32))).astype(np.uint64)
    out = np.zeros(np.shape(pool), dtype=np.uint64)
    for i in range(4):
        index = (selector >> (4 * i)) & 7
        out |= ((pool >> np.uint64(8 * index)) & np.uint64(0xFF)) << np.uint64(8 * i)
    return out.astype(U32)


def test_every_e4m3_byte_becomes_its_exact_bf16_value() -> None:
    codes = np.arange(256, dtype=U32)
    words = codes | ((codes ^ 0x5A) << 8) | ((255 - codes) << 16) | (((codes * 7) & 0xFF) << 24)
    expected = [(words >> (8 * b)) & 0xFF for b in range(4)]
    for selector, first in ((0x1404, 0), (0x3424, 2)):
        spread = byte_perm(words, np.zeros_like(words), selector)
        bits = (spread & 0x80008000) | ((spread & 0x7F007F00) >> 4)
        for half, value in zip(bf16_halves(bits), (expected[first], expected[first + 1]), strict=True):
            want = value.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
            finite = np.isfinite(want)
            np.testing.assert_array_equal(half[finite] * 2.0**120, want[finite])
            np.testing.assert_array_equal(
                half[~finite] * 2.0**120, np.full((~finite).sum(), 480.0) * np.sign(half[~finite])
            )


def test_every_int8_code_becomes_its_exact_bf16_value() -> None:
    codes = np.arange(-128, 128, dtype=np.int64)
    words = (codes.astype(np.int8).view(np.uint8).astype(U32)) * U32(0x01010101)
    offset = words ^ U32(0x80808080)
    magic = np.full_like(words, 0x4B000000)
    floats = [byte_perm(offset, magic, 0x7440 | b).view(np.float32).astype(np.float64) - 8388736.0 for b in range(4)]
    for value in floats:
        np.testing.assert_array_equal(value, codes)
    as_bits = [np.asarray(v, dtype=np.float32).view(U32) for v in floats]
    lo, hi = bf16_halves(byte_perm(as_bits[0], as_bits[1], 0x7632))
    np.testing.assert_array_equal(lo, codes)
    np.testing.assert_array_equal(hi, codes)


def test_interleaved_nvfp4_words_give_each_pair_its_scaled_values() -> None:
    columns = 64
    weight = nvfp4_from_float(np.random.default_rng(1).standard_normal((5, columns)).astype(np.float32))
    stored = np.asarray(weight.data).view(np.uint8)
    packed, scales, _factors = split_rows(stored, columns)
    elements = unpack_e2m1(packed).astype(np.float64)
    group_scales = np.asarray(scales).view(ml_dtypes.float8_e4m3fn).astype(np.float64)

    interleaved = interleave_nvfp4(stored, columns)
    assert interleaved.shape == stored.shape == (5, row_bytes(columns))
    np.testing.assert_array_equal(interleaved[:, columns // 2 :], stored[:, columns // 2 :])
    words = interleaved[:, : columns // 2].copy().view("<u4").astype(U32)  # [rows, columns / 8]
    scale_bits = (group_scales[:, np.arange(columns // 8) // 2] * 2.0**118).astype(np.float32).view(U32) >> 16
    for t in range(4):
        shifted = (words << U32(12 - 4 * t)) & U32(0xFFFFFFFF)
        bits = (shifted & 0x80008000) | ((shifted & 0x70007000) >> 6)
        scale = bf16_halves(scale_bits)[0]
        for half, column in zip(bf16_halves(bits), (2 * t, 2 * t + 1), strict=True):
            product = (half * scale).astype(ml_dtypes.bfloat16).astype(np.float64)  # one bf16 rounding, as fma
            want = elements[:, column::8] * group_scales[:, np.arange(columns // 8) // 2] * 2.0**-8
            np.testing.assert_array_equal(product, want)
