"""GGUF block formats (llama.cpp's Q8_0, Q4_0, Q4_K, ...) as `QuantizedWeight` formats kept as stored.

A GGUF tensor ``[N, K]`` of a block type is N rows of ``K / block_size`` blocks, each ``type_size`` bytes
holding its elements and their scales (GGUF's own encoding). Such a weight is kept as those bytes:
``QuantizedWeight(format, data uint8 [..., N, K / block_size * type_size], scales None, block (1,
block_size), shape [..., N, K])``, registered here as a `PackedFormat` named ``gguf_<type>`` (`FORMATS`).
Since blocks never span rows, moving, fusing or stacking whole rows of bytes is exact.

Values come from the maintained ``gguf`` package (`gguf.quants.dequantize`), never decoded here. The
formats kept: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (32-element blocks) and Q4_K, Q5_K, Q6_K (256-element
super-blocks): every type of llama.cpp's Q4_0 ... Q8_0 and Q4_K_M / Q5_K_M / Q6_K files. Other types
(F16, BF16, F32, Q2_K, Q3_K, the IQ types, ...) are read as floats by `atlas_core.weights.gguf`.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from atlas_core.weights.quantized import PackedFormat, QuantizedWeight, register_packed_format

Q = GGMLQuantizationType
FORMATS: dict[GGMLQuantizationType, str] = {
    qtype: f"gguf_{qtype.name.lower()}" for qtype in (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K)
}
"""GGML tensor types kept quantized -> their `QuantizedWeight` format names (``gguf_q4_k``, ...)."""
QTYPES: dict[str, GGMLQuantizationType] = {name: qtype for qtype, name in FORMATS.items()}
"""Format name -> GGML tensor type."""
BYTES = np.dtype(np.uint8)
_BLOCKS_PER_ROW = 512
"""Blocks per row handed to `gguf.quants.dequantize`: it works in groups of rows, so rows far longer than
a tensor's own (any whole number of blocks will do) cut its per-group overhead."""


def row_bytes(qtype: GGMLQuantizationType, columns: int) -> int:
    """Bytes of one row of ``columns`` elements of ``qtype``; ValueError unless they are whole blocks."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if columns % block_size:
        raise ValueError(f"a {qtype.name} row holds whole blocks of {block_size} elements, not {columns}")
    return columns // block_size * type_size


def dequantize_bytes(data: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> np.ndarray:
    """The float32 values of a tensor of ``shape`` stored as ``qtype`` in ``data`` (its bytes, any shape),
    by `gguf.quants.dequantize`; float types come back as their values in float32 too."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    flat = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    n_blocks = flat.size // type_size
    per_row = next((n for n in range(min(_BLOCKS_PER_ROW, n_blocks), 0, -1) if n_blocks % n == 0), 1)
    values = gguf_dequantize(flat.reshape(-1, per_row * type_size), qtype)
    return np.asarray(values, dtype=np.float32).reshape(shape)


def gguf_weight(data: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> QuantizedWeight:
    """A `QuantizedWeight` over a GGUF tensor's bytes (``data``, uint8, reshaped to rows of blocks)."""
    rows = np.asarray(data).view(np.uint8).reshape(*shape[:-1], row_bytes(qtype, shape[-1]))
    return QuantizedWeight(FORMATS[qtype], rows, None, (1, GGML_QUANT_SIZES[qtype][0]), tuple(shape))


def quantize(values: np.ndarray, qtype: GGMLQuantizationType) -> QuantizedWeight:
    """``values [..., N, K]`` quantized by `gguf.quants.quantize` (types it implements: Q8_0, Q4_0, Q4_1,
    Q5_0, Q5_1; K-quants raise NotImplementedError there)."""
    from gguf.quants import quantize as gguf_quantize

    array = np.ascontiguousarray(values, dtype=np.float32)
    return gguf_weight(gguf_quantize(array, qtype), qtype, tuple(array.shape))


K_QUANTS = (Q.Q4_K, Q.Q5_K, Q.Q6_K)
"""Types the gguf package cannot quantize: `random_gguf_weight` gives them random blocks."""


def random_gguf_weight(
    rng: np.random.Generator, qtype: GGMLQuantizationType, shape: tuple[int, ...]
) -> QuantizedWeight:
    """A random ``shape`` weight (``[..., N, K]``) in ``qtype``, for tests and benchmarks: normal values times 0.05
    quantized by the gguf package where it can (the 32-element block types), else random K-quant blocks whose
    f16 super-block scales are set small (d 2^-10 and dmin 2^-11; Q6_K's d 2^-12), so that the values stay
    below 2 (Q4_K and Q6_K below 1)."""
    if qtype not in K_QUANTS:
        return quantize(rng.standard_normal(shape, dtype=np.float32) * 0.05, qtype)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (int(np.prod(shape)) // block_size, type_size), dtype=np.uint8)
    if qtype == Q.Q6_K:
        blocks[:, type_size - 2 :] = np.full((len(blocks), 1), 2.0**-12, dtype=np.float16).view(np.uint8)
    else:
        blocks[:, 0:4] = np.tile(np.array([2.0**-10, 2.0**-11], dtype=np.float16), (len(blocks), 1)).view(np.uint8)
    return gguf_weight(blocks.reshape(*shape[:-1], -1), qtype, shape)


def _packed(qtype: GGMLQuantizationType) -> PackedFormat:
    def data_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
        return (*shape[:-1], row_bytes(qtype, shape[-1]))

    def dequantize(weight: QuantizedWeight) -> np.ndarray:
        return dequantize_bytes(np.asarray(weight.data), qtype, weight.shape)

    return PackedFormat(data_shape, dequantize)


for _qtype, _name in FORMATS.items():
    register_packed_format(_name, BYTES, _packed(_qtype))
