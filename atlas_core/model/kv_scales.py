"""The fp8 KV-cache scales a checkpoint carries per attention layer (used when ``kv_cache_dtype=fp8``).

vLLM's fp8 checkpoints store ``{attention}.k_scale`` and ``{attention}.v_scale`` (older ones one
``{attention}.kv_scale`` for both); compressed-tensors checkpoints with a ``kv_cache_scheme`` store the
same names, or (older exports) ``{attention}.k_proj.output_scale`` / ``{attention}.v_proj.output_scale``.
Each is one positive float: stored fp8 = x / scale. A layer without them gets 1.0.
"""

from __future__ import annotations

import numpy as np

from atlas_core.errors import ModelLoadError
from atlas_core.weights.source import WeightSource

SCALE_NAMES = (("k_scale", "v_scale"), ("kv_scale", "kv_scale"), ("k_proj.output_scale", "v_proj.output_scale"))
"""Per attention prefix, the (key, value) scale tensor names looked for, in order."""


def checkpoint_kv_scales(source: WeightSource, prefix: str, origin: str) -> tuple[float, float]:
    """``(k_scale, v_scale)`` of the attention layer named ``prefix`` (e.g. ``model.layers.0.self_attn.``):
    the first pair of `SCALE_NAMES` the checkpoint holds, else ``(1.0, 1.0)``. `ModelLoadError` if a scale
    is not a single positive finite number (per-head or per-channel KV scales are not supported)."""
    for k_name, v_name in SCALE_NAMES:
        if prefix + k_name in source and prefix + v_name in source:
            return _scalar(source, prefix + k_name, origin), _scalar(source, prefix + v_name, origin)
    return 1.0, 1.0


def _scalar(source: WeightSource, name: str, origin: str) -> float:
    values = np.asarray(source.get(name), dtype=np.float32).reshape(-1)
    if values.size != 1 or not np.isfinite(values[0]) or values[0] <= 0:
        raise ModelLoadError(
            f"{origin}: KV-cache scale {name!r} must be one positive number (per-tensor), got shape "
            f"{np.shape(source.get(name))} with values {values[:4].tolist()}"
        )
    return float(values[0])
