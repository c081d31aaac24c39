"""NVFP4 weights: 4-bit E2M1 elements, an FP8 E4M3 scale per group of 16 along K, and a global scale.

An NVFP4 linear weight ``[N, K]`` (K a multiple of 16) is stored by compressed-tensors and ModelOpt as
three tensors: the elements packed two a byte (uint8 ``[N, K / 2]``, the even column in the low nibble,
bits 0-3, the odd column in the high nibble; a code is the ``float4_e2m1fn`` bit pattern: bit 3 the sign,
magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6), one ``float8_e4m3fn`` scale per group of 16 columns (``[N, K /
16]``) and one float32 global scale. It stands for

    W[i, j] = e2m1[i, j] * float32(e4m3[i, j // 16] * factor)

in float32, where ``factor`` is ``1 / weight_global_scale`` for compressed-tensors (whose formula is
``weight_scale / weight_global_scale``) and ``weight_scale_2`` for ModelOpt (``weight_scale *
weight_scale_2``). The group factor is computed in float64 and rounded once to float32: an E4M3 value has
4 significant bits, so this gives the same float32 as each format's own float32 division or product.

`QuantizedWeight` format `NVFP4` (a `PackedFormat`) keeps each row's bytes together in ``data``, uint8
``[..., N, K / 2 + K / 16 + 8]``: the K / 2 packed elements, the K / 16 E4M3 scales, then the row's
factor as a little-endian float64 (``scales`` None, ``block (1, 16)``). Whole rows then move, fuse and
stack exactly, also when fused parts had different global scales. That is the file's 0.5625 bytes per
element plus 8 bytes a row.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from atlas_core.weights.quantized import PackedFormat, QuantizedWeight, register_packed_format

NVFP4 = "nvfp4"
"""The `QuantizedWeight` format name."""
GROUP = 16
"""Columns per E4M3 group scale."""
E2M1_MAX = 6.0
"""The largest E2M1 magnitude."""
E4M3_MAX = 448.0
"""The largest finite E4M3 magnitude."""
E2M1 = np.dtype(ml_dtypes.float4_e2m1fn)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
_FLOAT32 = np.dtype(np.float32)


def pack_e2m1(elements: np.ndarray) -> np.ndarray:
    """``float4_e2m1fn`` elements ``[..., K]`` (K even) packed into uint8 ``[..., K / 2]``: even columns in
    the low nibble, odd columns in the high nibble."""
    codes = np.asarray(elements, dtype=E2M1).view(np.uint8) & 0x0F
    if codes.shape[-1] % 2:
        raise ValueError(f"NVFP4 packs pairs of columns; got {codes.shape[-1]} columns")
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack_e2m1(packed: np.ndarray) -> np.ndarray:
    """The inverse of `pack_e2m1`: uint8 ``[..., K / 2]`` -> ``float4_e2m1fn`` ``[..., K]``."""
    packed = np.asarray(packed).view(np.uint8)
    codes = np.empty((*packed.shape[:-1], packed.shape[-1] * 2), dtype=np.uint8)
    codes[..., 0::2] = packed & 0x0F
    codes[..., 1::2] = packed >> 4
    return codes.view(E2M1)


def row_bytes(columns: int) -> int:
    """Bytes of one packed row of ``columns`` elements; ValueError unless ``columns`` is a multiple of 16."""
    if columns % GROUP:
        raise ValueError(f"an NVFP4 row holds whole groups of {GROUP} elements, not {columns}")
    return columns // 2 + columns // GROUP + 8


def _data_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (*shape[:-1], row_bytes(shape[-1]))


def nvfp4_weight(packed: np.ndarray, scales: np.ndarray, factor: Any) -> QuantizedWeight:
    """The `QuantizedWeight` of stored tensors: ``packed`` uint8 ``[..., N, K / 2]``, ``scales`` E4M3 (or
    their bytes) ``[..., N, K / 16]`` and ``factor`` (float, or one per matrix ``[...]``, or per row ``[...,
    N]``), the global factor the group scales are multiplied by."""
    packed = np.asarray(packed).view(np.uint8)
    scales = np.asarray(scales).view(np.uint8)
    shape = (*packed.shape[:-1], packed.shape[-1] * 2)
    if scales.shape != (*shape[:-1], shape[-1] // GROUP):
        raise ValueError(f"an NVFP4 weight {shape} needs {GROUP}-column scales {(*shape[:-1], shape[-1] // GROUP)}")
    factors = np.asarray(factor, dtype="<f8")
    if factors.ndim < len(shape) - 1:
        factors = factors.reshape(*factors.shape, *(1,) * (len(shape) - 1 - factors.ndim))
    factors = np.ascontiguousarray(np.broadcast_to(factors, shape[:-1]))[..., None]
    data = np.concatenate([packed, scales, factors.view(np.uint8)], axis=-1)
    return QuantizedWeight(NVFP4, data, None, (1, GROUP), shape)


def split_rows(data: Any, columns: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(packed uint8 [..., N, K / 2], scales E4M3 [..., N, K / 16], factors float64 [..., N, 1])`` of an
    NVFP4 weight's ``data`` (host arrays)."""
    data = np.asarray(data).view(np.uint8)
    half, groups = columns // 2, columns // GROUP
    factors = np.ascontiguousarray(data[..., half + groups :]).view("<f8")
    return data[..., :half], data[..., half : half + groups].view(E4M3), factors


def group_factors(scales: np.ndarray, factors: np.ndarray) -> np.ndarray:
    """float32 ``[..., N, K / 16]``: each group's E4M3 scale times its row's factor, rounded once."""
    return (np.asarray(scales, dtype=E4M3).astype(np.float64) * factors).astype(_FLOAT32)


def dequantize_nvfp4(weight: QuantizedWeight) -> np.ndarray:
    """The float32 values of an NVFP4 `QuantizedWeight` (the module docstring's formula)."""
    cols = weight.shape[-1]
    packed, scales, factors = split_rows(weight.data, cols)
    elements = unpack_e2m1(packed).astype(_FLOAT32)
    grouped = elements.reshape(*elements.shape[:-1], cols // GROUP, GROUP) * group_factors(scales, factors)[..., None]
    return grouped.reshape(*weight.shape)


def quantize_nvfp4(weight: np.ndarray, global_scale: float, divide: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quantize a float weight ``[..., N, K]`` (K a multiple of 16) the way NVFP4 checkpoints are made.

    ``global_scale`` is the checkpoint's value (compressed-tensors: ``weight_global_scale = 448 * 6 /
    amax``, ``divide=True``; ModelOpt: ``weight_scale_2 = amax / (448 * 6)``, ``divide=False``). Per group
    of 16 the scale is the group's absolute maximum / 6 brought into the global scale's units and
    rounded to E4M3; the element is ``weight / (scale and global scale combined)`` rounded to the nearest
    E2M1 (ties to even, clipped to +-6; 0 for an all-zero group). Returns ``(packed uint8 [..., N, K / 2],
    scales float8_e4m3fn [..., N, K / 16], the global scale as float32 [1])``."""
    values = np.asarray(weight, dtype=_FLOAT32)
    rows, cols = values.shape[-2:]
    if cols % GROUP:
        raise ValueError(f"NVFP4 needs K to be a multiple of {GROUP}, got {cols}")
    stored = np.asarray([global_scale], dtype=_FLOAT32)
    factor = 1.0 / np.float64(stored[0]) if divide else np.float64(stored[0])
    groups = values.reshape(*values.shape[:-1], cols // GROUP, GROUP)
    amax = np.abs(groups).max(axis=-1).astype(np.float64)
    scales = np.clip(amax / E2M1_MAX / factor, 0, E4M3_MAX).astype(_FLOAT32).astype(E4M3)
    effective = (scales.astype(np.float64) * factor).astype(_FLOAT32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = np.where(effective > 0, groups / effective, np.float32(0))
    elements = np.clip(scaled, -E2M1_MAX, E2M1_MAX).astype(E2M1).reshape(values.shape)
    return pack_e2m1(elements), scales, stored


def nvfp4_from_float(weight: np.ndarray, divide: bool = True) -> QuantizedWeight:
    """``weight`` ``[..., N, K]`` as the NVFP4 `QuantizedWeight` a checkpoint of it would load as: one global scale
    from its absolute maximum (compressed-tensors' ``448 * 6 / amax`` with ``divide``, ModelOpt's ``amax / (448 *
    6)`` without), then `quantize_nvfp4`."""
    amax = float(np.abs(np.asarray(weight, dtype=_FLOAT32)).max()) or 1.0
    packed, scales, stored = quantize_nvfp4(
        weight, E4M3_MAX * E2M1_MAX / amax if divide else amax / (E4M3_MAX * E2M1_MAX), divide
    )
    return nvfp4_weight(packed, scales, 1.0 / np.float64(stored[0]) if divide else np.float64(stored[0]))


register_packed_format(NVFP4, E2M1, PackedFormat(_data_shape, dequantize_nvfp4))
