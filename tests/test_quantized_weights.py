"""`QuantizedWeight` and its host operations: the dequantization formula on whole and partial edge blocks
(small blocks and the published 128 x 128 with padding), quantization as checkpoints are published, exact
fusing / reordering / stacking, and the NumPy backend's dequantize-on-use `linear` and MoE experts."""

from __future__ import annotations

import logging

import ml_dtypes
import numpy as np
import pytest

from atlas_core.backends import numpy_backend
from atlas_core.backends.numpy_backend import NumpyBackend
from atlas_core.backends.ops.moe import moe_experts_reference
from atlas_core.weights.quantized import (
    FP8_E4M3,
    QuantizedWeight,
    concat_rows,
    dequantize,
    quantize_fp8,
    regrid,
    stack_experts,
    take_rows,
)

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)


def random_weight(rng: np.random.Generator, shape: tuple[int, ...], block: tuple[int, int]) -> QuantizedWeight:
    """Random finite float8 elements and positive scales on the grid of ``block``."""
    data = (rng.standard_normal(shape) * 40).astype(E4M3)
    grid = (*shape[:-2], -(-shape[-2] // block[0]), -(-shape[-1] // block[1]))
    scales = rng.uniform(0.001, 0.02, grid).astype(np.float32)
    return QuantizedWeight(FP8_E4M3, data, scales, block, shape)


def formula(weight: QuantizedWeight) -> np.ndarray:
    """``W[i, j] = float(data[i, j]) * scales[i // bn, j // bk]``, element by element."""
    rows, cols = weight.shape
    bn, bk = weight.block
    out = np.empty((rows, cols), dtype=np.float32)
    for i in range(rows):
        for j in range(cols):
            out[i, j] = np.float32(float(weight.data[i, j]) * float(weight.scales[i // bn, j // bk]))
    return out


@pytest.mark.parametrize(
    ("shape", "block"),
    [((40, 50), (16, 16)), ((16, 32), (16, 16)), ((200, 300), (128, 128)), ((7, 5), (128, 128)), ((9, 33), (4, 8))],
    ids=["partial-16", "whole-16", "padded-128", "one-padded-128", "partial-4x8"],
)
def test_dequantize_is_the_published_formula_on_edge_blocks(shape: tuple[int, int], block: tuple[int, int]) -> None:
    weight = random_weight(np.random.default_rng(1), shape, block)
    np.testing.assert_array_equal(dequantize(weight), formula(weight))


def test_quantize_fp8_uses_block_amax_over_448() -> None:
    rng = np.random.default_rng(2)
    values = rng.standard_normal((40, 50)).astype(np.float32)
    values[16:32, 16:32] = 0.0  # an all-zero block
    weight = quantize_fp8(values, (16, 16))
    assert weight.scales.shape == (3, 4) and weight.data.dtype == E4M3
    for i in range(3):
        for j in range(4):
            block = values[16 * i : 16 * (i + 1), 16 * j : 16 * (j + 1)]
            amax = np.abs(block).max()
            assert weight.scales[i, j] == (np.float32(amax) / np.float32(448) if amax else 1.0)
            if amax:  # the largest element of each block is stored as +-448
                assert np.abs(weight.data[16 * i : 16 * (i + 1), 16 * j : 16 * (j + 1)].astype(np.float32)).max() == 448
    # E4M3 keeps 3 mantissa bits: each element within half a step (2**-4 relative) of its value
    error = np.abs(dequantize(weight) - values)
    assert np.all(error <= np.abs(values) * 2.0**-4 + 1e-6 * weight.scales.max())
    assert not np.any(dequantize(weight)[16:32, 16:32])


def test_quantize_fp8_rounds_scales_to_their_storage_dtype() -> None:
    values = np.random.default_rng(3).standard_normal((8, 8)).astype(np.float32)
    weight = quantize_fp8(values, (1, 8), scale_dtype=ml_dtypes.bfloat16)
    np.testing.assert_array_equal(weight.scales, weight.scales.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_quantized_weight_checks_its_shapes() -> None:
    data = np.zeros((40, 50), dtype=E4M3)
    with pytest.raises(ValueError, match=r"scales have shape \(2, 4\).*needs \(3, 4\)"):
        QuantizedWeight(FP8_E4M3, data, np.ones((2, 4), np.float32), (16, 16), (40, 50))
    with pytest.raises(ValueError, match="unknown quantized format 'int4'"):
        QuantizedWeight("int4", data, np.ones((3, 4), np.float32), (16, 16), (40, 50))
    weight = QuantizedWeight(FP8_E4M3, data, np.ones((3, 4), np.float32), (16, 16), (40, 50))
    assert weight.nbytes == 40 * 50 + 12 * 4 and weight.dtype == E4M3


def test_dequantize_reads_raw_bytes_as_the_format() -> None:
    weight = random_weight(np.random.default_rng(4), (20, 24), (16, 16))
    as_bytes = weight.map_arrays(lambda a: a.view(np.uint8) if a.dtype == E4M3 else a)
    np.testing.assert_array_equal(dequantize(as_bytes), dequantize(weight))


@pytest.mark.parametrize(
    ("rows", "blocks"),
    [((32, 16, 16), [(16, 16)] * 3), ((40, 24, 24), [(16, 16)] * 3), ((64, 32), [(128, 128), (1, 128)])],
    ids=["aligned", "partial-rows", "mixed-grids"],
)
def test_concat_rows_equals_concatenating_the_values(rows: tuple[int, ...], blocks: list[tuple[int, int]]) -> None:
    rng = np.random.default_rng(5)
    parts = [random_weight(rng, (n, 48), block) for n, block in zip(rows, blocks, strict=True)]
    fused = concat_rows(parts)
    assert isinstance(fused, QuantizedWeight) and fused.shape == (sum(rows), 48)
    np.testing.assert_array_equal(dequantize(fused), np.concatenate([dequantize(p) for p in parts]))
    if rows == (32, 16, 16):
        assert fused.block == (16, 16)  # whole blocks of rows: scales concatenated as they are
    else:
        assert fused.block[0] == 1  # one scale row per output row


def test_concat_rows_of_mixed_parts_is_float() -> None:
    rng = np.random.default_rng(6)
    quantized, plain = random_weight(rng, (8, 16), (4, 4)), rng.standard_normal((8, 16)).astype(np.float32)
    np.testing.assert_array_equal(concat_rows([quantized, plain]), np.concatenate([dequantize(quantized), plain]))


@pytest.mark.parametrize("crossing", [False, True], ids=["within-blocks", "across-blocks"])
def test_take_rows_moves_rows_with_their_scales(crossing: bool) -> None:
    weight = random_weight(np.random.default_rng(7), (40, 20), (16, 16))
    order = np.arange(40)
    if crossing:  # row 3 (first block of rows) and row 20 (second) trade places
        order[[3, 20]] = order[[20, 3]]
    else:  # rows 16..23 reversed, all inside the second block
        order[16:24] = order[16:24][::-1]
    moved = take_rows(weight, order)
    assert isinstance(moved, QuantizedWeight)
    assert moved.block == ((1, 16) if crossing else (16, 16))
    np.testing.assert_array_equal(dequantize(moved), dequantize(weight)[order])


def test_stack_experts_on_a_common_grid() -> None:
    rng = np.random.default_rng(8)
    parts = [random_weight(rng, (24, 32), (8, 16)), random_weight(rng, (24, 32), (24, 32))]
    bank = stack_experts(parts)
    assert isinstance(bank, QuantizedWeight) and bank.shape == (2, 24, 32) and bank.block == (8, 16)
    for e, part in enumerate(parts):
        np.testing.assert_array_equal(dequantize(bank.expert(e)), dequantize(part))


def test_regrid_only_refines() -> None:
    weight = random_weight(np.random.default_rng(9), (48, 48), (16, 16))
    np.testing.assert_array_equal(dequantize(regrid(weight, (8, 4))), dequantize(weight))
    with pytest.raises(ValueError, match="cannot regrid"):
        regrid(weight, (12, 16))


def test_numpy_linear_dequantizes_on_use(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(10)
    backend = NumpyBackend()
    weight = backend.upload_quantized(random_weight(rng, (200, 96), (128, 128)))
    assert isinstance(weight, QuantizedWeight)
    x, bias = rng.standard_normal((5, 96)).astype(np.float32), rng.standard_normal(200).astype(np.float32)
    want = x @ dequantize(weight).T + bias
    np.testing.assert_array_equal(backend.linear(x, weight, bias), want)
    monkeypatch.setattr(numpy_backend, "DEQUANTIZE_ELEMENTS", 96 * 8)  # chunks of whole 128-row blocks
    np.testing.assert_allclose(backend.linear(x, weight, bias), want, rtol=1e-6, atol=1e-6)
    per_tensor = backend.upload_quantized(random_weight(rng, (200, 96), (200, 96)))  # re-gridded to rows first
    out = np.empty((5, 200), np.float32)
    assert backend.linear(x, per_tensor, out=out) is out
    np.testing.assert_allclose(out, x @ dequantize(per_tensor).T, rtol=1e-6, atol=1e-6)


def test_moe_experts_with_quantized_banks() -> None:
    rng = np.random.default_rng(11)
    w_in, w_out = random_weight(rng, (4, 48, 32), (16, 16)), random_weight(rng, (4, 32, 24), (16, 16))
    x = rng.standard_normal((6, 32)).astype(np.float32)
    ids = rng.integers(0, 4, (6, 2)).astype(np.int32)
    weights = rng.uniform(0, 1, (6, 2)).astype(np.float32)
    got = moe_experts_reference(x, w_in, w_out, weights, ids, activation="silu")
    want = moe_experts_reference(x, dequantize(w_in), dequantize(w_out), weights, ids, activation="silu")
    np.testing.assert_array_equal(got, want)


class FloatOnlyBackend(NumpyBackend):
    """A backend that executes no quantized format."""

    name = "float-only"
    quantized_formats = frozenset()


def test_a_backend_without_the_format_dequantizes_at_load(caplog: pytest.LogCaptureFixture) -> None:
    backend = FloatOnlyBackend()
    weight = random_weight(np.random.default_rng(12), (20, 24), (16, 16))
    with caplog.at_level(logging.WARNING, logger="atlas.backends"):
        first, second = backend.upload_quantized(weight), backend.upload_quantized(weight)
    assert isinstance(first, np.ndarray) and first.dtype == np.float32
    np.testing.assert_array_equal(first, dequantize(weight))
    np.testing.assert_array_equal(second, first)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "'float-only' does not execute fp8_e4m3 weights" in warnings[0]
