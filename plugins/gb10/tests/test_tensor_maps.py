"""Tensor maps for the TMA loads: the checks made before the driver is asked, and how a map is passed to a kernel
(its bytes, by value). The driver's encoding itself runs in the device tests (`test_cuda_kernels.py`)."""

from __future__ import annotations

import numpy as np
import pytest
from atlas_gb10.launch import kernel_argument
from atlas_gb10.tensor_maps import TENSOR_MAP, bf16_rows_map


def test_a_misaligned_matrix_is_refused_before_the_driver() -> None:
    with pytest.raises(ValueError, match="16-byte aligned address and row stride"):
        bf16_rows_map(0x1002, 256, 1024, 1024, 128, 64)
    with pytest.raises(ValueError, match="1027 bf16 elements between rows"):
        bf16_rows_map(0x1000, 256, 1024, 1027, 128, 64)


@pytest.mark.parametrize(("rows", "columns"), [(257, 64), (128, 128), (0, 64)])
def test_a_box_outside_the_swizzle_is_refused(rows: int, columns: int) -> None:
    with pytest.raises(ValueError, match=f"box of {rows} x {columns}"):
        bf16_rows_map(0x1000, 256, 1024, 1024, rows, columns)


def test_a_tensor_map_is_passed_as_its_bytes() -> None:
    value = np.arange(16, dtype=np.uint64).view(TENSOR_MAP)[0]
    argument = kernel_argument(value)
    assert bytes(argument) == np.arange(16, dtype="<u8").tobytes()
