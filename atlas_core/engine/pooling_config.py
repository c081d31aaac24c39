"""How a checkpoint wants its embeddings made: pooling, normalisation and truncation.

Read from the sentence-transformers files an embedding checkpoint ships (``modules.json``, the
``Pooling`` module's ``config.json``: ``pooling_mode_lasttoken`` / ``pooling_mode_mean_tokens``; a
``Normalize`` module) and from ``config.json`` (``matryoshka_dimensions`` / ``is_matryoshka``: the
vector may be truncated). Without those files a decoder is pooled as Qwen3-Embedding-style
checkpoints are: the last token's final hidden state, L2-normalised.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from atlas_core.engine.pooling import PoolingType
from atlas_core.errors import InvalidRequestError

log = logging.getLogger("atlas.model")


@dataclass(frozen=True)
class PoolingConfig:
    """``pooling``: which hidden states make the vector. ``normalize``: L2-normalise it.
    ``truncatable``: the vector may be cut to its first ``dimensions`` values (Matryoshka training);
    ``dimension_choices``: the sizes it was trained for, when the checkpoint lists them (None: any)."""

    pooling: PoolingType = "last"
    normalize: bool = True
    truncatable: bool = False
    dimension_choices: tuple[int, ...] | None = None

    def check_dimensions(self, dimensions: int | None, size: int) -> None:
        """`InvalidRequestError` unless ``dimensions`` (None: the full ``size``) can be served."""
        if dimensions is None or dimensions == size:
            return
        if not self.truncatable:
            raise InvalidRequestError(
                f"dimensions={dimensions}: this model's embeddings have {size} dimensions and it does not support "
                "truncating them (no Matryoshka training declared); leave dimensions out"
            )
        if not 1 <= dimensions <= size:
            raise InvalidRequestError(f"dimensions must be between 1 and {size}, got {dimensions}")
        if self.dimension_choices is not None and dimensions not in self.dimension_choices:
            choices = ", ".join(str(d) for d in self.dimension_choices)
            raise InvalidRequestError(f"dimensions={dimensions} is not one this model supports: {choices}")

    def finish(self, pooled: np.ndarray, dimensions: int | None = None) -> np.ndarray:
        """The embedding of a pooled vector: truncated to ``dimensions`` (checked first, see
        `check_dimensions`), then L2-normalised when ``normalize``; float32."""
        self.check_dimensions(dimensions, pooled.shape[-1])
        vector = np.asarray(pooled, dtype=np.float32)[: dimensions or None]
        if self.normalize:
            norm = float(np.linalg.norm(vector.astype(np.float64)))
            vector = vector / max(norm, 1e-12)
        return vector.astype(np.float32)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log.warning("%s is not readable JSON (%s); ignored", path, exc)
        return None


def pooling_config(checkpoint: Path, config: dict[str, Any], override: PoolingType | None = None) -> PoolingConfig:
    """The `PoolingConfig` of the checkpoint at ``checkpoint`` whose ``config.json`` is ``config``;
    ``override`` (``--pooling``) replaces the pooling it declares."""
    pooling: PoolingType = "last"
    normalize = True
    modules = _read_json(checkpoint / "modules.json") if (checkpoint / "modules.json").is_file() else None
    if isinstance(modules, list):
        types = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules if isinstance(m, dict)}
        normalize = "Normalize" in types
        module = types.get("Pooling")
        settings = _read_json(checkpoint / str(module.get("path", "")) / "config.json") if module else None
        if isinstance(settings, dict):
            if settings.get("pooling_mode_mean_tokens"):
                pooling = "mean"
            elif not settings.get("pooling_mode_lasttoken"):
                log.warning("%s: only last-token and mean pooling are supported; using last-token", checkpoint)
    dimensions = config.get("matryoshka_dimensions")
    choices = tuple(int(d) for d in dimensions) if isinstance(dimensions, list) and dimensions else None
    truncatable = bool(config.get("is_matryoshka")) or choices is not None
    return PoolingConfig(override or pooling, normalize, truncatable, choices)
