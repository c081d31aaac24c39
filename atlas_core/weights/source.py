"""The protocol every checkpoint reader implements.

A `WeightSource` exposes tensors under Hugging Face parameter names (e.g.
``model.layers.0.self_attn.q_proj.weight``), whatever the file format stores, so family
loaders map names once. Arrays are NumPy arrays in the checkpoint's float dtype
(float32, float16, or ``ml_dtypes.bfloat16``); quantized formats are dequantized to float32.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np


class WeightSource(Protocol):
    """Read-only access to one checkpoint's tensors and its config."""

    config: dict[str, Any]
    """The model config as a `config.json` dict (GGUF sources synthesise one)."""

    def names(self) -> Iterator[str]:
        """Every tensor name, in Hugging Face naming."""
        ...

    def __contains__(self, name: str) -> bool: ...

    def get(self, name: str) -> np.ndarray:
        """Return the tensor; raise `ModelLoadError` naming the file if it is absent or corrupt."""
        ...
