"""The bit manipulations the quantized GEMM kernels use to turn stored bytes into bf16 operands, replayed in NumPy
without a GPU: every E4M3 byte (``fp8.cuh``: e4m3x4_to_bf16x2), every int8 code (``gemm_gguf.cuh``:
i8x4_to_bf16x2), and every E2M1 code times every E4M3 scale in the word order `interleave_nvfp4` gives NVFP4 rows
(``gemm_nvfp4.cuh``: e2m1_pair_scaled), the upload layouts that give each kernel lane its bytes of several chunks
in one load (`pair_fp8_chunks`, `nvfp4_device_rows`), and the GGUF block formats' codes and coefficients per chunk
and lane (``gemm_gguf_blocks.cuh``) against `gguf.quants.dequantize`. The GPU suite checks the kernels' products
themselves."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from atlas_gb10.quantized_weights import (
    GGUF_APART,
    device_row_bytes,
    gguf_device_rows,
    interleave_nvfp4,
    nvfp4_device_rows,
    pair_fp8_chunks,
    q8_0_device_rows,
)
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

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


def lane_chunks(columns: int, group: int) -> list[tuple[int, int, bool]]:
    """(chunk, lane q, whether in a full group of ``group`` chunks) for every 32-element chunk of a row."""
    chunks, full = -(-columns // 32), columns // (32 * group) * group
    return [(c, q, c < full) for c in range(chunks) for q in range(4)]


@pytest.mark.parametrize("columns", [64, 160, 200])
def test_paired_fp8_rows_give_each_lane_its_bytes_of_two_chunks(columns: int) -> None:
    rows = np.random.default_rng(columns).integers(0, 256, (3, columns), dtype=np.uint8)
    paired = pair_fp8_chunks(rows)
    assert paired.shape == rows.shape and not np.shares_memory(paired, rows)
    for c, q, full in lane_chunks(columns, 2):
        start = c * 32 + 8 * q  # the lane's elements of chunk c, as x is read
        want = rows[:, start : min(start + 8, columns)]
        if full:  # load_fp8_pair: 16 bytes at the group's start + 16 q, chunk c % 2's half
            group = c // 2 * 64 + 16 * q
            got = paired[:, group + 8 * (c % 2) : group + 8 * (c % 2) + 8]
        else:  # the row's last chunk alone, as stored
            got = paired[:, start : min(start + 8, columns)]
        np.testing.assert_array_equal(got, want, err_msg=f"chunk {c}, lane {q}")


@pytest.mark.parametrize("columns", [64, 96, 256])
def test_q8_0_device_rows_give_each_lane_its_codes_and_each_block_its_scale(columns: int) -> None:
    blocks = np.random.default_rng(columns).integers(0, 256, (3, columns // 32, 34), dtype=np.uint8)
    device = q8_0_device_rows(blocks.reshape(3, -1))
    assert device.shape[-1] % 16 == 0 and device.shape[-1] - (columns + columns // 16) < 16
    for c, q, full in lane_chunks(columns, 2):
        want = blocks[:, c, 2 + 8 * q : 2 + 8 * q + 8]  # the lane's codes of block c
        start = c // 2 * 64 + 16 * q + 8 * (c % 2) if full else c * 32 + 8 * q
        np.testing.assert_array_equal(device[:, start : start + 8], want, err_msg=f"chunk {c}, lane {q}")
        np.testing.assert_array_equal(device[:, columns + 2 * c : columns + 2 * c + 2], blocks[:, c, :2])


@pytest.mark.parametrize("fmt", sorted(GGUF_APART))
def test_gguf_device_rows_put_each_block_where_the_kernels_read_it(fmt: str) -> None:
    high_at, coefficients = GGUF_APART[fmt]
    size, columns = 16 + coefficients + (4 if high_at else 0), 96
    blocks = np.random.default_rng(size).integers(0, 256, (3, columns // 32, size), dtype=np.uint8)
    device = gguf_device_rows(blocks.reshape(3, -1), fmt)
    assert device.shape[-1] % 16 == 0 and device.shape[-1] - columns // 32 * size < 16
    high_start, coefficient_start = columns // 2, columns // 2 + (columns // 8 if high_at else 0)
    for b in range(columns // 32):  # gguf_chunk_in's and gguf_coefficients' offsets for block b
        np.testing.assert_array_equal(device[:, 16 * b : 16 * b + 16], blocks[:, b, size - 16 :])
        if high_at:
            np.testing.assert_array_equal(
                device[:, high_start + 4 * b : high_start + 4 * b + 4], blocks[:, b, high_at : high_at + 4]
            )
        at = coefficient_start + coefficients * b
        np.testing.assert_array_equal(device[:, at : at + coefficients], blocks[:, b, :coefficients])


@pytest.mark.parametrize("columns", [128, 208, 2048])
def test_nvfp4_device_rows_give_each_lane_its_words_and_scales_of_four_chunks(columns: int) -> None:
    weight = nvfp4_from_float(np.random.default_rng(columns).standard_normal((3, columns)).astype(np.float32))
    stored = np.asarray(weight.data).view(np.uint8)
    words, scales = (
        interleave_nvfp4(stored, columns)[:, : columns // 2],
        stored[:, columns // 2 : columns // 2 + columns // 16],
    )
    device = nvfp4_device_rows(stored, columns)
    assert device.shape == (3, device_row_bytes(columns)) and device.shape[-1] % 16 == 0
    np.testing.assert_array_equal(device[:, columns // 2 + columns // 16 : row_bytes(columns)], stored[:, -8:])
    assert not device[:, row_bytes(columns) :].any()
    for c, q, full in lane_chunks(columns, 4):
        start = c * 32 + 8 * q
        if start >= columns:
            continue
        want_word, want_scale = words[:, start // 2 : start // 2 + 4], scales[:, start // 16]
        if full:  # nvfp4_quad_at: 16 bytes of codes from the group's 16 q, 4 scale bytes from its 4 (q / 2)
            base = c // 4 * 64 + 16 * q + 4 * (c % 4)
            got_word = device[:, base : base + 4]
            got_scale = device[:, columns // 2 + c // 4 * 8 + 4 * (q // 2) + c % 4]
        else:  # load_nvfp4x8: the interleaved word and the group's scale where they are stored
            got_word, got_scale = device[:, start // 2 : start // 2 + 4], device[:, columns // 2 + start // 16]
        np.testing.assert_array_equal(got_word, want_word, err_msg=f"chunk {c}, lane {q}")
        np.testing.assert_array_equal(got_scale, want_scale, err_msg=f"chunk {c}, lane {q}")


GGUF_BLOCK_BYTES = {2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 12: (256, 144), 13: (256, 176), 14: (256, 210)}
"""GGML type id -> (elements, bytes) of a block, as ``gemm_gguf_blocks.cuh``'s GgufBlocks declares them."""


def gguf_kernel_values(block: np.ndarray, ggml_type: int) -> np.ndarray:
    """One block's values as ``gemm_gguf_blocks.cuh`` computes them, step by step: for each 32-wide chunk and lane
    q, the 8 code bytes and the high bits gguf_chunk reads, the code pairs gguf_operand makes of them (byte_pair,
    shifts, masks; code - bias), and gguf_coefficients' s (Q6_K: by half), o; value = s * (code - bias) + o."""
    size, _ = GGUF_BLOCK_BYTES[ggml_type]
    u8 = block.astype(np.uint32)

    def f16(offset: int) -> float:
        return float(block[offset : offset + 2].copy().view(np.float16)[0])

    def words(offset: int, count: int = 8) -> np.ndarray:  # little-endian 32-bit words of `count` bytes
        return block[offset : offset + count].copy().view("<u4").astype(np.uint32)

    def byte_pair(v: np.ndarray, t: int) -> int:
        return int(byte_perm(v[t // 2], np.uint32(0), 0x4342 if t & 1 else 0x4140))

    values = np.zeros(size)
    for chunk in range(size // 32):
        sub = chunk
        for q in range(4):
            first = 8 * q
            high = np.zeros(2, dtype=np.uint32)
            if ggml_type in (2, 3, 6, 7):
                codes = words({2: 2, 3: 4, 6: 6, 7: 8}[ggml_type] + (first & 15))
                if ggml_type in (6, 7):
                    high[0] = words({6: 2, 7: 4}[ggml_type], 4)[0] >> np.uint32(first)
                bias = {2: 8, 3: 0, 6: 16, 7: 0}[ggml_type]
                s = s_hi = f16(0)
                o = f16(2) if ggml_type in (3, 7) else 0.0
            elif ggml_type in (12, 13):
                codes = words((16 if ggml_type == 12 else 48) + 32 * (sub >> 1) + first)
                if ggml_type == 13:
                    high = words(16 + first)
                scales = u8[4:16]
                if sub < 4:
                    sc, mn = scales[sub] & 63, scales[sub + 4] & 63
                else:
                    sc = (scales[sub + 4] & 0xF) | ((scales[sub - 4] >> 6) << 4)
                    mn = (scales[sub + 4] >> 4) | ((scales[sub] >> 6) << 4)
                bias, s, o = 0, f16(0) * float(sc), -(f16(2) * float(mn))
                s_hi = s
            else:
                h, r = sub >> 2, sub & 3
                codes, high = words(64 * h + 32 * (r & 1) + first), words(128 + 32 * h + first)
                bias, o = 32, 0.0
                s = f16(208) * float(block[192 + 8 * h + 2 * r].astype(np.int8))
                s_hi = f16(208) * float(block[192 + 8 * h + 2 * r + 1].astype(np.int8))
            for t in range(4):
                if ggml_type in (2, 3, 6, 7):
                    n = (byte_pair(codes, t) >> ((q >> 1) * 4)) & 0x000F000F
                    if ggml_type in (6, 7):
                        n |= ((int(high[0]) >> (2 * t)) & 1) << 4 | ((int(high[0]) >> (2 * t + 1)) & 1) << 20
                elif ggml_type in (12, 13):
                    n = (byte_pair(codes, t) >> (4 * (sub & 1))) & 0x000F000F
                    if ggml_type == 13:
                        n |= ((byte_pair(high, t) >> sub) & 0x00010001) << 4
                else:
                    n = ((byte_pair(codes, t) >> (4 * (r >> 1))) & 0x000F000F) | (
                        ((byte_pair(high, t) >> (2 * r)) & 0x00030003) << 4
                    )
                for half, code in enumerate((n & 0xFFFF, n >> 16)):
                    assert code < 128
                    scale = s_hi if ggml_type == 14 and q >= 2 else s
                    values[32 * chunk + first + 2 * t + half] = scale * (code - bias) + o
    return values


@pytest.mark.parametrize("ggml_type", sorted(GGUF_BLOCK_BYTES))
def test_gguf_block_kernels_read_the_values_gguf_defines(ggml_type: int) -> None:
    qtype = GGMLQuantizationType(ggml_type)
    size, nbytes = GGUF_BLOCK_BYTES[ggml_type]
    assert GGML_QUANT_SIZES[qtype] == (size, nbytes)
    rng = np.random.default_rng(ggml_type)
    blocks = rng.integers(0, 256, (3, nbytes), dtype=np.uint8)
    scale_offsets = {14: [208]}.get(ggml_type, [0, 2] if ggml_type in (3, 7, 12, 13) else [0])
    for offset in scale_offsets:  # finite, modest f16 scales
        blocks[:, offset : offset + 2] = np.float16(rng.uniform(0.01, 0.1)).reshape(1).view(np.uint8)
    expected = gguf_dequantize(blocks, qtype).astype(np.float64).reshape(3, size)
    for block, want in zip(blocks, expected, strict=True):
        np.testing.assert_allclose(gguf_kernel_values(block, ggml_type), want, rtol=1e-6, atol=1e-7)
