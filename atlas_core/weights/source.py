"""The protocol every checkpoint reader implements.

A `WeightSource` exposes tensors under Hugging Face parameter names (e.g.
``model.layers.0.self_attn.q_proj.weight``), whatever the file format stores, so family
loaders map names once. Arrays are NumPy arrays in the checkpoint's float dtype
(float32, float16, or ``ml_dtypes.bfloat16``); quantized formats are dequantized to float32 by `get`.

A source whose checkpoints keep weights quantized (FP8 and NVFP4 safetensors, GGUF blocks) also offers
``get_quantized(name) -> QuantizedWeight | None``, the weight as stored; `quantized_tensor` asks for
it, so sources without quantized tensors need not implement it. A source that can read part of a tensor
(``get_part(name, index)``) and its shape alone (``shape(name)``) lets a rank of a split model read only
its share (`tensor_part`, `tensor_shape`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from atlas_core.weights.quantized import QuantizedWeight


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


def quantized_tensor(source: WeightSource, name: str) -> QuantizedWeight | None:
    """Tensor ``name`` of ``source`` as a host `QuantizedWeight` when the source stores it quantized, else None."""
    get_quantized = getattr(source, "get_quantized", None)
    return None if get_quantized is None else get_quantized(name)


def tensor_shape(source: WeightSource, name: str) -> tuple[int, ...]:
    """Tensor ``name``'s shape: from the source's ``shape(name)`` when it has one (read from a file header),
    else from the tensor itself."""
    shape = getattr(source, "shape", None)
    return tuple(source.get(name).shape) if shape is None else tuple(shape(name))


def tensor_part(source: WeightSource, name: str, index: tuple[slice, ...]) -> np.ndarray:
    """The part ``index`` (one slice per leading axis) of float tensor ``name``: read alone through the
    source's ``get_part`` when it has one, else cut from the whole tensor."""
    get_part = getattr(source, "get_part", None)
    return np.ascontiguousarray(source.get(name)[index]) if get_part is None else get_part(name, index)
