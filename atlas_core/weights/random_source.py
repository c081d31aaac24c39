"""`RandomWeightSource`: a checkpoint of random bf16 tensors in given shapes (``load_format="dummy"``).

Every tensor is a slice of one pool of random normal bf16 values (standard deviation `WEIGHT_STD`;
1-D tensors are norm weights and scales near 1, or biases near 0), chosen from the tensor's name alone:
every process that reads a name gets the same values, so the ranks of a split model read consistent
shares of the same random model, and loading costs a copy. The shapes come from the family's loader
(`ModelWeightLoader.checkpoint_shapes`), so a model is built exactly as from its real checkpoint.

A config.json that declares a quantization (``quantization_config``: FP8 or NVFP4, `QuantizationScheme`) gets
its decoder layers' linear weights quantized as such a checkpoint stores them (`get_quantized`, `quantizable`):
FP8 elements from one pool of E4M3 bytes with one scale in every block, NVFP4 elements from random bytes with
one group scale and factor, so that benchmarks run the quantized kernels at their real bytes. A config.json
holding `GGUF_TYPE_KEY` (written by ``atlas bench --quantization gguf_q4_k`` and the like; no checkpoint has it)
gets those weights in that GGUF block format instead (`random_gguf_weight`'s blocks), wherever their rows hold
whole blocks.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from atlas_core.errors import ModelLoadError
from atlas_core.weights.gguf_quantized import gguf_weight, random_gguf_weight
from atlas_core.weights.nvfp4 import NVFP4, nvfp4_weight
from atlas_core.weights.quant_config import QuantizationScheme
from atlas_core.weights.quantized import ELEMENT_DTYPES, FP8_E4M3, QuantizedWeight, dequantize, scale_grid

POOL_ELEMENTS = 1 << 26
POOL_BLOCKS = 1 << 16
"""Blocks in the pool of random GGUF blocks (`gguf_pool`)."""
GGUF_TYPE_KEY = "atlas_random_gguf_type"
"""The config.json key naming the GGML type (``Q4_K``, ...) of a random model's quantized weights."""
WEIGHT_STD = 0.02
BF16 = np.dtype(ml_dtypes.bfloat16)
NEAR_ONE_SUFFIXES = ("norm.weight", "scale", "layer_scalar")
"""1-D tensors drawn near 1 (norm weights, router and layer scales); other 1-D tensors near 0."""
FP8_SCALE = WEIGHT_STD * 8 / 448
"""The block scale of random FP8 weights: the pool's values over it span about a sixth of E4M3's range."""
NVFP4_FACTOR = WEIGHT_STD / 2
"""The global factor of random NVFP4 weights (group scales 1.0): elements of magnitude 0.5-6 give 0.005-0.06."""
NOT_QUANTIZED = (
    "norm",
    "embed",
    "lm_head",
    "conv1d",
    "A_log",
    "dt_bias",
    "vision",
    "visual",
    "router",
    "eh_proj",
    "in_proj_a.",
    "in_proj_b.",
    "in_proj_ba.",
)
"""Name parts of tensors a quantized checkpoint keeps in floats (with gates, ``...gate.weight``): norms, embeddings,
the LM head, convolutions, state-space parameters, vision towers, routers, DeepSeek's MTP projection and the gated
delta net's small gate projections."""


def quantizable(name: str, shape: tuple[int, ...], block: int = 16) -> bool:
    """Whether a quantized checkpoint stores tensor ``name`` quantized: a linear weight or expert bank of a decoder
    layer (at least 2-D, whole groups of 16 columns, or of ``block`` for a GGUF block format), not a router or gate,
    norm, embedding or convolution."""
    return (
        ".layers." in name
        and len(shape) >= 2
        and shape[-1] % math.lcm(16, block) == 0
        and not name.endswith("gate.weight")
        and not any(part in name for part in NOT_QUANTIZED)
    )


@functools.lru_cache(maxsize=1)
def random_pool(seed: int) -> np.ndarray:
    """`POOL_ELEMENTS` random normal bf16 values (standard deviation `WEIGHT_STD`), made once per seed:
    every tensor of a `RandomWeightSource` is a slice of it (read-only)."""
    pool = (np.random.default_rng(seed).standard_normal(POOL_ELEMENTS, dtype=np.float32) * WEIGHT_STD).astype(BF16)
    pool.flags.writeable = False
    return pool


@functools.lru_cache(maxsize=1)
def fp8_pool(seed: int) -> np.ndarray:
    """`random_pool` over `FP8_SCALE` in E4M3 (read-only): the elements of random FP8 weights."""
    pool = (random_pool(seed).astype(np.float32) / np.float32(FP8_SCALE)).astype(ELEMENT_DTYPES[FP8_E4M3])
    pool.flags.writeable = False
    return pool


@functools.lru_cache(maxsize=1)
def byte_pool(seed: int) -> np.ndarray:
    """`POOL_ELEMENTS` uniformly random bytes (read-only): the packed elements of random NVFP4 weights."""
    pool = np.random.default_rng([seed, 1]).integers(0, 256, POOL_ELEMENTS, dtype=np.uint8)
    pool.flags.writeable = False
    return pool


@functools.lru_cache(maxsize=1)
def gguf_pool(seed: int, qtype: GGMLQuantizationType) -> np.ndarray:
    """The bytes of `POOL_BLOCKS` random blocks of ``qtype`` (read-only, `random_gguf_weight`): random GGUF
    weights are runs of whole blocks of it."""
    block_size = GGML_QUANT_SIZES[qtype][0]
    rng = np.random.default_rng([seed, 2])
    pool = np.ascontiguousarray(random_gguf_weight(rng, qtype, (POOL_BLOCKS, block_size)).data).reshape(-1)
    pool.flags.writeable = False
    return pool


class RandomWeightSource:
    """A `WeightSource` of random bf16 tensors with the given names and shapes; a name's values depend
    only on the name and ``seed``."""

    def __init__(self, config: dict[str, Any], shapes: dict[str, tuple[int, ...]], seed: int = 0) -> None:
        self.config = config
        self.seed = seed
        self._pool = random_pool(seed)
        self._shapes = shapes
        self.quantization = QuantizationScheme.from_config(config)
        """The quantization config.json declares (None: every tensor bf16)."""
        self.gguf_type = GGMLQuantizationType[config[GGUF_TYPE_KEY]] if GGUF_TYPE_KEY in config else None
        """The GGUF block format of the quantized weights (`GGUF_TYPE_KEY`), or None."""

    @classmethod
    def for_loader(cls, config: dict[str, Any], loader_class: Any) -> RandomWeightSource:
        """The tensors ``loader_class`` reads for ``config``: its checkpoint's, and its MTP layers' where the
        family has them (built only when speculation asks for them)."""
        shapes = dict(loader_class.checkpoint_shapes(config))
        if hasattr(loader_class, "mtp_checkpoint_shapes"):
            shapes |= loader_class.mtp_checkpoint_shapes(config)
        return cls(config, shapes)

    def names(self) -> Iterator[str]:
        return iter(self._shapes)

    def __contains__(self, name: str) -> bool:
        return name in self._shapes

    def get(self, name: str) -> np.ndarray:
        """Tensor ``name`` in bf16 (a quantized one's values as float32, dequantized)."""
        quantized = self.get_quantized(name)
        if quantized is not None:
            return dequantize(quantized)
        shape = self._shape(name)
        if len(shape) == 1:  # norm weights and scales near 1, biases near 0
            noise = self._rng(name).standard_normal(shape[0], dtype=np.float32) * 0.02
            return (noise + (1.0 if name.endswith(NEAR_ONE_SUFFIXES) else 0.0)).astype(BF16)
        return self._slice(self._pool, name, shape)

    def get_quantized(self, name: str) -> QuantizedWeight | None:
        """Tensor ``name`` as the declared quantization stores it, when it is `quantizable`; else None."""
        scheme, shape = self.quantization, self._shape(name)
        if self.gguf_type is not None:
            return self._gguf_quantized(name, shape, self.gguf_type)
        if scheme is None or not quantizable(name, shape):
            return None
        if scheme.format == NVFP4:
            packed = self._slice(byte_pool(self.seed), name, (*shape[:-1], shape[-1] // 2))
            scales = np.full((*shape[:-1], shape[-1] // 16), 0x38, dtype=np.uint8)  # E4M3 1.0
            return nvfp4_weight(packed, scales, NVFP4_FACTOR)
        block = scheme.blocks[0] if scheme.blocks else (shape[-2], shape[-1])
        scales = np.full(scale_grid(shape, block), FP8_SCALE, dtype=np.float32)
        return QuantizedWeight(FP8_E4M3, self._slice(fp8_pool(self.seed), name, shape), scales, block, shape)

    def _gguf_quantized(self, name: str, shape: tuple[int, ...], qtype: GGMLQuantizationType) -> QuantizedWeight | None:
        """Tensor ``name`` as runs of `gguf_pool`'s blocks, when it is `quantizable` in whole blocks; else None."""
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        if not quantizable(name, shape, block_size):
            return None
        blocks = self._slice(
            gguf_pool(self.seed, qtype), name, (math.prod(shape) // block_size * type_size,), type_size
        )
        return gguf_weight(blocks, qtype, shape)

    def shape(self, name: str) -> tuple[int, ...]:
        """Tensor ``name``'s shape, without building it."""
        return self._shape(name)

    def _shape(self, name: str) -> tuple[int, ...]:
        if name not in self._shapes:
            raise ModelLoadError(f"random weights: no tensor {name!r} in a {self.config.get('model_type')} model")
        return self._shapes[name]

    def _rng(self, name: str) -> np.random.Generator:
        return np.random.default_rng([self.seed, zlib.crc32(name.encode())])

    def _slice(self, pool: np.ndarray, name: str, shape: tuple[int, ...], unit: int = 1) -> np.ndarray:
        """``shape``'s worth of ``pool`` from an offset, a multiple of ``unit``, that depends on ``name`` only
        (repeated past its end)."""
        count = math.prod(shape)
        if count > pool.size:
            return np.resize(pool, count).reshape(shape)
        start = unit * int(self._rng(name).integers(0, (pool.size - count) // unit + 1))
        return pool[start : start + count].reshape(shape)
