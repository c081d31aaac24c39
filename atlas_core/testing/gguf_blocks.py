"""GGUF block weights for tests and benchmarks: any block format kept quantized (`QuantizedWeight` ``gguf_*``)."""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from atlas_core.weights.gguf_quantized import gguf_weight, quantize
from atlas_core.weights.quantized import QuantizedWeight

K_QUANTS = (Q.Q4_K, Q.Q5_K, Q.Q6_K)
"""Types the gguf package cannot quantize: `gguf_blocks` gives them random blocks."""


def gguf_blocks(rng: np.random.Generator, qtype: Q, shape: tuple[int, ...]) -> QuantizedWeight:
    """A ``shape`` weight (``[..., N, K]``) in ``qtype``: normal values times 0.05 quantized by the gguf package
    where it can (the 32-element block types), else random K-quant blocks whose f16 super-block scales are set
    small (d 2^-10 and dmin 2^-11; Q6_K's d 2^-12), so that the values stay near the others' size."""
    if qtype not in K_QUANTS:
        return quantize(rng.standard_normal(shape, dtype=np.float32) * 0.05, qtype)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (int(np.prod(shape)) // block_size, type_size), dtype=np.uint8)
    if qtype == Q.Q6_K:
        blocks[:, type_size - 2 :] = np.full((len(blocks), 1), 2.0**-12, dtype=np.float16).view(np.uint8)
    else:
        blocks[:, 0:4] = np.tile(np.array([2.0**-10, 2.0**-11], dtype=np.float16), (len(blocks), 1)).view(np.uint8)
    return gguf_weight(blocks.reshape(*shape[:-1], -1), qtype, shape)
