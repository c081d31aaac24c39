"""`RandomWeightSource`: a checkpoint of random bf16 tensors in given shapes (``load_format="dummy"``).

Every tensor is a slice of one pool of random normal bf16 values (standard deviation `WEIGHT_STD`;
1-D tensors are norm weights and scales near 1, or biases near 0), chosen from the tensor's name alone:
every process that reads a name gets the same values, so the ranks of a split model read consistent
shares of the same random model, and loading costs a copy. The shapes come from the family's loader
(`ModelWeightLoader.checkpoint_shapes`), so a model is built exactly as from its real checkpoint.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np

from atlas_core.errors import ModelLoadError

POOL_ELEMENTS = 1 << 26
WEIGHT_STD = 0.02
BF16 = np.dtype(ml_dtypes.bfloat16)
NEAR_ONE_SUFFIXES = ("norm.weight", "scale", "layer_scalar")
"""1-D tensors drawn near 1 (norm weights, router and layer scales); other 1-D tensors near 0."""


@functools.lru_cache(maxsize=1)
def random_pool(seed: int) -> np.ndarray:
    """`POOL_ELEMENTS` random normal bf16 values (standard deviation `WEIGHT_STD`), made once per seed:
    every tensor of a `RandomWeightSource` is a slice of it (read-only)."""
    pool = (np.random.default_rng(seed).standard_normal(POOL_ELEMENTS, dtype=np.float32) * WEIGHT_STD).astype(BF16)
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
        if name not in self._shapes:
            raise ModelLoadError(f"random weights: no tensor {name!r} in a {self.config.get('model_type')} model")
        shape = self._shapes[name]
        rng = np.random.default_rng([self.seed, zlib.crc32(name.encode())])
        if len(shape) == 1:  # norm weights and scales near 1, biases near 0
            noise = rng.standard_normal(shape[0], dtype=np.float32) * 0.02
            return (noise + (1.0 if name.endswith(NEAR_ONE_SUFFIXES) else 0.0)).astype(BF16)
        count = math.prod(shape)
        if count > POOL_ELEMENTS:
            return np.resize(self._pool, count).reshape(shape)
        start = int(rng.integers(0, POOL_ELEMENTS - count + 1))
        return self._pool[start : start + count].reshape(shape)
