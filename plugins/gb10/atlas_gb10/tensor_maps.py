"""Tensor maps (``CUtensorMap``) for the Hopper kernels' TMA loads, encoded by the CUDA driver.

A tensor map describes a 2-D bf16 matrix in device memory to the TMA unit: its address, shape and row stride,
the box one copy brings into shared memory, and the shared-memory swizzle. Kernels take it by value (a
``__grid_constant__`` parameter), passed from here as a NumPy structured scalar of its 128 bytes. Encoding is a
host call (``cuTensorMapEncodeTiled``, CUDA 12 and later) cached on its arguments, which are all a map depends on.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

from atlas_gb10.launch import cuda_driver, driver_error_name

TENSOR_MAP = np.dtype([("opaque", "<u8", (16,))])
"""A ``CUtensorMap``: 16 opaque 64-bit words (the kernels declare it 64-byte aligned)."""

BFLOAT16 = 9  # CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
INTERLEAVE_NONE = 0
SWIZZLE_128B = 3  # CU_TENSOR_MAP_SWIZZLE_128B: row r's 16-byte chunk c at r * 128 + (c ^ (r % 8)) * 16
L2_PROMOTION_256B = 3
OOB_FILL_ZEROS = 0  # CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: elements outside the matrix read as zeros

MAX_BOX = 256
"""The most elements a box may span in each dimension."""


@functools.cache
def _encoder() -> Any:
    encode = cuda_driver().cuTensorMapEncodeTiled
    encode.argtypes = [
        ctypes.c_void_p,  # CUtensorMap *
        ctypes.c_int,  # data type
        ctypes.c_uint,  # rank
        ctypes.c_void_p,  # global address
        ctypes.POINTER(ctypes.c_uint64),  # global dims, innermost first
        ctypes.POINTER(ctypes.c_uint64),  # global strides in bytes (rank - 1 of them)
        ctypes.POINTER(ctypes.c_uint32),  # box dims
        ctypes.POINTER(ctypes.c_uint32),  # element strides
        ctypes.c_int,  # interleave
        ctypes.c_int,  # swizzle
        ctypes.c_int,  # L2 promotion
        ctypes.c_int,  # out-of-bounds fill
    ]
    return encode


@functools.lru_cache(maxsize=512)
def bf16_rows_map(address: int, rows: int, columns: int, row_stride: int, box_rows: int, box_columns: int) -> np.void:
    """The tensor map of the ``[rows, columns]`` bf16 matrix at device ``address`` whose rows start ``row_stride``
    elements apart, read in boxes of ``box_rows`` x ``box_columns`` (128 bytes of columns: the 128-byte swizzle's
    row) into 128-byte-swizzled shared memory, zeros outside the matrix.

    Raises ValueError where TMA cannot read the matrix: an address or row stride that is not a multiple of 16
    bytes, or a box over `MAX_BOX`; RuntimeError with the driver's reason where it refuses the map."""
    if address % 16 or (row_stride * 2) % 16:
        raise ValueError(
            f"a TMA matrix needs a 16-byte aligned address and row stride, got address {address:#x} and "
            f"{row_stride} bf16 elements between rows"
        )
    if not (0 < box_rows <= MAX_BOX and 0 < box_columns <= MAX_BOX and box_columns * 2 <= 128):
        raise ValueError(f"a TMA box of {box_rows} x {box_columns} bf16 does not fit the 128-byte swizzle")
    buffer = np.zeros(TENSOR_MAP.itemsize + 64, dtype=np.uint8)  # the driver writes a 64-byte aligned map
    start = -buffer.ctypes.data % 64
    dims = (ctypes.c_uint64 * 2)(columns, rows)
    strides = (ctypes.c_uint64 * 1)(row_stride * 2)
    box = (ctypes.c_uint32 * 2)(box_columns, box_rows)
    steps = (ctypes.c_uint32 * 2)(1, 1)
    status = _encoder()(
        buffer.ctypes.data + start,
        BFLOAT16,
        2,
        address,
        dims,
        strides,
        box,
        steps,
        INTERLEAVE_NONE,
        SWIZZLE_128B,
        L2_PROMOTION_256B,
        OOB_FILL_ZEROS,
    )
    if status:
        raise RuntimeError(
            f"cuTensorMapEncodeTiled refused a {rows} x {columns} bf16 matrix at {address:#x} (row stride "
            f"{row_stride}, box {box_rows} x {box_columns}): {driver_error_name(status)}"
        )
    return buffer[start : start + TENSOR_MAP.itemsize].copy().view(TENSOR_MAP)[0]
