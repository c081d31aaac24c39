"""Quantized weights as typed values, and the host operations loaders apply to them.

A `QuantizedWeight` is one linear weight (``[N, K]``, output rows first, as Hugging Face stores it) or a
bank of them (``[E, N, K]``: routed experts), kept in its checkpoint's encoding: ``data`` holds the
encoded elements and ``scales`` one float32 factor per block of ``block = (bn, bk)`` elements of the
last two axes. The only format so far is `FP8_E4M3`:

    W[..., i, j] = float(data[..., i, j]) * scales[..., i // bn, j // bk]

with ``data`` in float8 E4M3 (``ml_dtypes.float8_e4m3fn``: no infinities, largest finite 448) and
``scales [..., ceil(N / bn), ceil(K / bk)]``, the last block of a row or column cut short when N or K is
not a multiple of the block (a "partial edge block" keeps its whole scale). One grid covers every
published FP8 layout: block-scaled checkpoints (DeepSeek-V3, Qwen3-FP8, MiniMax-M2: ``(128, 128)``),
per-channel scales (``(1, K)``: ``scales [N, 1]``) and per-tensor scales (``(N, K)``: ``scales [1, 1]``).

The value flows from the checkpoint reader through the family loader (`concat_rows` fuses Q/K/V and
gate/up projections, `take_rows` reorders rows, `stack_experts` builds expert banks: each exact, so
the dequantized result equals the dequantized parts rearranged) to `Backend.upload_quantized`, which
keeps it quantized on a backend that lists its format in ``quantized_formats`` (its arrays then
become backend arrays) and otherwise dequantizes it once. `dequantize` is the reference formula.

Formats that pack their elements and scales together in ``data`` (GGUF's blocks: `PackedFormat`) are
registered by their own modules with `register_packed_format`; their weights have ``scales`` None and
``block`` ``(1, elements per packed block)``, and the helpers below move their rows as whole rows of bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import ml_dtypes
import numpy as np

FP8_E4M3 = "fp8_e4m3"
"""Float8 E4M3 elements (``float8_e4m3fn``) times one float32 scale per block."""
FP8_E4M3_MAX = 448.0
"""The largest finite float8 E4M3 value: a block's absolute maximum maps to it when quantizing."""
ELEMENT_DTYPES: dict[str, np.dtype] = {FP8_E4M3: np.dtype(ml_dtypes.float8_e4m3fn)}
"""Each format's element dtype on the host."""
FLOAT32 = np.dtype(np.float32)


@dataclass(frozen=True)
class PackedFormat:
    """A format whose ``data`` holds each row's elements and scales packed in bytes (``scales`` is None).

    ``data_shape``: the shape ``data`` has for a weight of a logical shape ``[..., N, K]`` (``[..., N,
    bytes per row]``); raises ValueError when such a weight cannot be stored. ``dequantize``: the weight's
    values as float32 host arrays of its logical shape, from ``data`` alone (host arrays)."""

    data_shape: Callable[[tuple[int, ...]], tuple[int, ...]]
    dequantize: Callable[[QuantizedWeight], np.ndarray]


PACKED_FORMATS: dict[str, PackedFormat] = {}
"""Packed formats by name, filled by `register_packed_format`."""


ROW_ALIGNMENT = 16
"""A packed format's rows may be padded to a multiple of this many bytes on a backend (aligned vector loads)."""


def padded_row_bytes(width: int) -> int:
    """``width`` bytes rounded up to a multiple of `ROW_ALIGNMENT`."""
    return -(-width // ROW_ALIGNMENT) * ROW_ALIGNMENT


def register_packed_format(name: str, dtype: np.dtype, packed: PackedFormat) -> None:
    """Make ``name`` a `QuantizedWeight` format whose ``data`` (of element dtype ``dtype``) is ``packed``."""
    ELEMENT_DTYPES[name] = np.dtype(dtype)
    PACKED_FORMATS[name] = packed


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A weight kept in a quantized format (see the module docstring).

    ``format``: one of `ELEMENT_DTYPES`. ``data``: the encoded elements, ``[..., N, K]`` (host NumPy
    arrays, or a backend's arrays once uploaded natively). ``scales``: float32 ``[..., ceil(N / bn),
    ceil(K / bk)]``, or None for a `PackedFormat`. ``block``: ``(bn, bk)``, elements of the last two axes
    per scale. ``shape``: the logical shape of the weight it stands for (equal to ``data.shape`` for 8-bit
    formats; a packed format's ``data_shape`` of it, or that with rows padded to `ROW_ALIGNMENT` bytes, as a
    backend may keep them for aligned loads).
    """

    format: str
    data: Any
    scales: Any
    block: tuple[int, int]
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.format not in ELEMENT_DTYPES:
            raise ValueError(f"unknown quantized format {self.format!r}; known: {sorted(ELEMENT_DTYPES)}")
        shape, bn, bk = tuple(self.shape), *self.block
        if len(shape) < 2 or bn < 1 or bk < 1:
            raise ValueError(f"QuantizedWeight needs at least 2 axes and a positive block, got {shape}, {self.block}")
        packed = PACKED_FORMATS.get(self.format)
        if packed is not None:
            want, got = packed.data_shape(shape), tuple(self.data.shape)
            padded = got[:-1] == want[:-1] and got[-1] == padded_row_bytes(want[-1])
            if self.scales is not None or (got != want and not padded):
                raise ValueError(
                    f"{self.format} weight of shape {shape} needs data of shape {want} and no scales, got {got} "
                    f"and {type(self.scales).__name__}"
                )
            return
        if tuple(self.data.shape) != shape:
            raise ValueError(f"QuantizedWeight data has shape {tuple(self.data.shape)}, expected {shape}")
        grid = scale_grid(shape, self.block)
        if tuple(self.scales.shape) != grid:
            raise ValueError(
                f"QuantizedWeight scales have shape {tuple(self.scales.shape)}; a {shape} weight in blocks of "
                f"{self.block} needs {grid}"
            )

    @property
    def dtype(self) -> np.dtype:
        """The element dtype of the format (``float8_e4m3fn``), whatever the backend stores the bytes as."""
        return ELEMENT_DTYPES[self.format]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes held: the encoded elements plus the scales."""
        return int(self.data.nbytes) + (0 if self.scales is None else int(self.scales.nbytes))

    def map_arrays(self, convert: Callable[[Any], Any]) -> QuantizedWeight:
        """The same weight with ``convert`` applied to ``data`` and ``scales`` (e.g. an upload)."""
        return replace(self, data=convert(self.data), scales=None if self.scales is None else convert(self.scales))

    def expert(self, index: int | np.integer) -> QuantizedWeight:
        """Matrix ``index`` of a bank ``[E, N, K]`` (a view)."""
        scales = None if self.scales is None else self.scales[index]
        return replace(self, data=self.data[index], scales=scales, shape=self.shape[1:])

    def __repr__(self) -> str:
        return f"QuantizedWeight({self.format}, shape={self.shape}, block={self.block})"


def scale_grid(shape: Sequence[int], block: tuple[int, int]) -> tuple[int, ...]:
    """The shape of the scales of a weight of ``shape`` in blocks of ``block``."""
    *lead, rows, cols = shape
    return (*lead, -(-rows // block[0]), -(-cols // block[1]))


def dequantize(weight: QuantizedWeight) -> np.ndarray:
    """The weight's values as float32 (host arrays): each element times its block's scale, rounded once
    to float32. ``data`` may also hold the raw bytes (e.g. uint8), which are viewed as the format's dtype.
    A `PackedFormat` decodes itself."""
    if weight.format in PACKED_FORMATS:
        return PACKED_FORMATS[weight.format].dequantize(weight)
    rows, cols = weight.shape[-2:]
    bn, bk = weight.block
    scales = np.asarray(weight.scales, dtype=FLOAT32)
    expanded = np.repeat(np.repeat(scales, bn, axis=-2)[..., :rows, :], bk, axis=-1)[..., :cols]
    data = np.asarray(weight.data)
    if data.dtype != weight.dtype:  # the raw bytes, as a backend without the dtype stores them (uint8)
        data = data.view(weight.dtype)
    return data.astype(FLOAT32) * expanded


def quantize_fp8(weight: np.ndarray, block: tuple[int, int], scale_dtype: Any = FLOAT32) -> QuantizedWeight:
    """Quantize a float weight ``[..., N, K]`` the way FP8 checkpoints are published: per block, the
    scale is the block's absolute maximum / 448 (1 for an all-zero block), rounded to ``scale_dtype``
    (checkpoints that store bfloat16 scales) and kept as float32, and the element is ``weight / scale``
    rounded to the nearest float8 E4M3 (clipped to +-448)."""
    values = np.asarray(weight, dtype=FLOAT32)
    rows, cols = values.shape[-2:]
    bn, bk = block
    grid = scale_grid(values.shape, block)
    padded = np.zeros((*values.shape[:-2], grid[-2] * bn, grid[-1] * bk), dtype=FLOAT32)
    padded[..., :rows, :cols] = np.abs(values)
    blocks = padded.reshape(*values.shape[:-2], grid[-2], bn, grid[-1], bk)
    amax = blocks.max(axis=(-3, -1))
    scales = np.where(amax > 0, amax / np.float32(FP8_E4M3_MAX), np.float32(1.0)).astype(FLOAT32)
    scales = scales.astype(scale_dtype).astype(FLOAT32)
    expanded = np.repeat(np.repeat(scales, bn, axis=-2)[..., :rows, :], bk, axis=-1)[..., :cols]
    data = np.clip(values / expanded, -FP8_E4M3_MAX, FP8_E4M3_MAX).astype(ELEMENT_DTYPES[FP8_E4M3])
    return QuantizedWeight(FP8_E4M3, data, scales, (bn, bk), tuple(values.shape))


def regrid(weight: QuantizedWeight, block: tuple[int, int]) -> QuantizedWeight:
    """The same weight (exactly) with scales on a finer grid ``block``, each of whose sides is 1 or
    divides the current one, so that every new block lies inside one old block and takes its scale."""
    (bn, bk), (new_bn, new_bk) = weight.block, block
    rows, cols = weight.shape[-2:]
    if (new_bn, new_bk) == (bn, bk):
        return weight
    if not (_refines(bn, new_bn, rows) and _refines(bk, new_bk, cols)):
        raise ValueError(f"cannot regrid blocks of {weight.block} to {block}: each side must divide the old one")
    grid = scale_grid(weight.shape, block)
    row_index = np.minimum(np.arange(grid[-2]) * new_bn // bn, weight.scales.shape[-2] - 1)
    col_index = np.minimum(np.arange(grid[-1]) * new_bk // bk, weight.scales.shape[-1] - 1)
    scales = np.asarray(weight.scales)[..., row_index, :][..., col_index]
    return replace(weight, scales=np.ascontiguousarray(scales), block=block)


def _refines(old: int, new: int, length: int) -> bool:
    """Whether blocks of ``new`` along an axis of ``length`` each lie inside one block of ``old``."""
    return old % new == 0 or (new >= length and old >= length)


def _common_block(weights: Sequence[QuantizedWeight], rows_per_block: int | None = None) -> tuple[int, int]:
    """A block every weight's grid refines to: the gcd of their sides (``rows_per_block`` forces the first)."""
    bn = rows_per_block if rows_per_block is not None else math.gcd(*(w.block[0] for w in weights))
    return bn, math.gcd(*(w.block[1] for w in weights))


def _check_same_format(weights: Sequence[QuantizedWeight]) -> None:
    formats = {w.format for w in weights}
    if len(formats) > 1:
        raise ValueError(f"cannot combine quantized weights of different formats: {sorted(formats)}")


def concat_rows(parts: Sequence[np.ndarray | QuantizedWeight]) -> np.ndarray | QuantizedWeight:
    """Weights ``[N_i, K]`` (or biases ``[N_i]``) concatenated along the output (first) axis, e.g. Q, K
    and V into one GEMM.

    Float arrays: `numpy.concatenate`. Quantized parts: their data and scales concatenated when they share
    a block and every part but the last fills whole blocks of rows; otherwise each part's scales are first
    spread to one row per scale (`regrid`, costs ``4 / bk`` bytes per element). Packed parts: their rows of
    bytes concatenated. Mixed parts (float and quantized, or two formats) are dequantized and concatenated
    as float32."""
    if len(parts) == 1:
        return parts[0]
    quantized = [p for p in parts if isinstance(p, QuantizedWeight)]
    if not quantized:
        return np.concatenate(parts)  # type: ignore[arg-type]
    if len(quantized) < len(parts) or len({w.format for w in quantized}) > 1:
        return np.concatenate([as_float(p) for p in parts])
    if any(w.ndim != 2 for w in quantized):
        raise ValueError(f"concat_rows needs 2-D weights, got {[w.shape for w in quantized]}")
    if quantized[0].scales is None:  # packed: whole rows of bytes
        data = np.concatenate([np.asarray(w.data) for w in quantized])
        rows = sum(w.shape[0] for w in quantized)
        return replace(quantized[0], data=data, shape=(rows, quantized[0].shape[1]))
    aligned = len({w.block for w in quantized}) == 1 and all(w.shape[-2] % w.block[0] == 0 for w in quantized[:-1])
    if not aligned:
        block = _common_block(quantized, rows_per_block=1)
        quantized = [regrid(w, block) for w in quantized]
    data = np.concatenate([np.asarray(w.data) for w in quantized])
    scales = np.concatenate([np.asarray(w.scales) for w in quantized])
    return QuantizedWeight(quantized[0].format, data, scales, quantized[0].block, tuple(data.shape))


def take_rows(weight: np.ndarray | QuantizedWeight, order: np.ndarray) -> np.ndarray | QuantizedWeight:
    """Rows (first axis) ``order`` of a weight ``[N, K]`` or vector ``[N]``, e.g. a permutation of rotary
    rows. A quantized weight keeps its blocks when every row stays in its block of rows, else its
    scales are spread to one row per scale first."""
    order = np.asarray(order)
    if not isinstance(weight, QuantizedWeight):
        return weight[order]
    if weight.ndim != 2:
        raise ValueError(f"take_rows needs a 2-D weight, got {weight.shape}")
    if weight.scales is None:  # packed: whole rows of bytes
        return replace(weight, data=np.asarray(weight.data)[order], shape=(len(order), weight.shape[1]))
    bn = weight.block[0]
    if len(order) != weight.shape[0] or np.any(order // bn != np.arange(len(order)) // bn):
        weight = regrid(weight, (1, weight.block[1]))
        scales = np.asarray(weight.scales)[order]
    else:
        scales = np.asarray(weight.scales)
    data = np.asarray(weight.data)[order]
    return QuantizedWeight(weight.format, data, scales, weight.block, tuple(data.shape))


def stack_experts(parts: Sequence[np.ndarray | QuantizedWeight]) -> np.ndarray | QuantizedWeight:
    """Per-expert weights ``[N, K]`` stacked into a bank ``[E, N, K]``; quantized parts on a common
    grid (`regrid` to the gcd of their blocks where they differ); mixed parts dequantized."""
    quantized = [p for p in parts if isinstance(p, QuantizedWeight)]
    if not quantized:
        return np.stack(parts)  # type: ignore[arg-type]
    if len(quantized) < len(parts):
        return np.stack([as_float(p) for p in parts])
    _check_same_format(quantized)
    if quantized[0].scales is None:  # packed
        data = np.stack([np.asarray(w.data) for w in quantized])
        return replace(quantized[0], data=data, shape=(len(quantized), *quantized[0].shape))
    block = _common_block(quantized)
    quantized = [regrid(w, block) for w in quantized]
    data = np.stack([np.asarray(w.data) for w in quantized])
    scales = np.stack([np.asarray(w.scales) for w in quantized])
    return QuantizedWeight(quantized[0].format, data, scales, block, tuple(data.shape))


def quantized_part(weight: QuantizedWeight, index: tuple[slice, ...]) -> QuantizedWeight:
    """Part ``index`` (a contiguous slice per leading axis: an expert bank's experts, rows, columns) of a
    quantized weight, copied out (of a file's memory map only that part is read); exact. A slice that
    does not start and end on its axis's block boundaries first spreads that axis's scales to a finer
    grid (`regrid`, to the gcd of the block and the bounds). A packed format's columns cannot be cut."""
    ndim = weight.ndim
    bounds = [range(size)[index[axis] if axis < len(index) else slice(None)] for axis, size in enumerate(weight.shape)]
    if any(b.step != 1 for b in bounds):
        raise ValueError(f"quantized_part takes contiguous slices, got {index}")
    if weight.scales is None:  # packed: whole rows of bytes
        if len(bounds[-1]) != weight.shape[-1]:
            raise ValueError(f"the columns of a {weight.format} weight cannot be cut (its blocks pack whole rows)")
        data = np.ascontiguousarray(np.asarray(weight.data)[tuple(slice(b.start, b.stop) for b in bounds[:-1])])
        return replace(weight, data=data, shape=tuple(len(b) for b in bounds))
    block = list(weight.block)
    for side, (axis, length) in enumerate(zip((ndim - 2, ndim - 1), weight.shape[-2:], strict=True)):
        cut = bounds[axis]
        ends = [cut.start] + ([cut.stop] if cut.stop < length else [])
        if any(end % block[side] for end in ends):
            block[side] = math.gcd(block[side], *ends)
    weight = regrid(weight, (block[0], block[1]))
    data_index = tuple(slice(b.start, b.stop) for b in bounds)
    scale_index = data_index[:-2] + tuple(
        slice(b.start // side, -(-b.stop // side)) for b, side in zip(bounds[-2:], block, strict=True)
    )
    data = np.ascontiguousarray(np.asarray(weight.data)[data_index])
    scales = np.ascontiguousarray(np.asarray(weight.scales)[scale_index])
    return QuantizedWeight(weight.format, data, scales, (block[0], block[1]), tuple(data.shape))


def as_float(weight: np.ndarray | QuantizedWeight) -> np.ndarray:
    """A host weight's values: `dequantize` for a quantized one, the array itself otherwise."""
    return dequantize(weight) if isinstance(weight, QuantizedWeight) else weight
