"""`quantized_part`: a rank's part of a quantized weight equals that part of the dequantized weight."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.weights.quantized import dequantize, quantize_fp8, quantized_part, stack_experts


@pytest.mark.parametrize("block", [(128, 128), (4, 8), (1, 24), (10, 24)])
@pytest.mark.parametrize("cut", [(slice(0, 5), slice(None)), (slice(3, 10), slice(None)), (slice(None), slice(8, 20))])
def test_a_part_is_exactly_that_part_of_the_values(block: tuple[int, int], cut: tuple[slice, slice]) -> None:
    weight = quantize_fp8(np.random.default_rng(0).standard_normal((10, 24)).astype(np.float32), block)
    part = quantized_part(weight, cut)
    np.testing.assert_array_equal(dequantize(part), dequantize(weight)[cut])
    assert part.data.flags.c_contiguous and part.shape == dequantize(weight)[cut].shape


def test_an_expert_banks_experts_and_rows() -> None:
    rng = np.random.default_rng(1)
    bank = stack_experts([quantize_fp8(rng.standard_normal((8, 16)).astype(np.float32), (4, 16)) for _ in range(4)])
    cut = (slice(2, 4), slice(2, 6), slice(None))
    np.testing.assert_array_equal(dequantize(quantized_part(bank, cut)), dequantize(bank)[cut])
