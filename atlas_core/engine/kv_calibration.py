"""fp8 KV-cache scales measured on text (``atlas calibrate-kv``), for checkpoints that do not carry them.

`measure_kv_scales` runs prompts through a model whose KV cache is in the activation dtype and reads back the
largest magnitude each layer stored: a layer's scale is ``amax * KV_SCALE_HEADROOM / 448``, so the keys and values
seen map to at most half of E4M3's range (room for larger ones later) and small ones stay out of its subnormals.
`write_kv_scales` / `read_kv_scales` keep them in a JSON file that the ``kv_cache_scales`` setting
(``--kv-cache-scales PATH``) applies in place of the checkpoint's scales (`atlas_core.model.kv_scales`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from atlas_core.backends.kv_dtypes import FP8_E4M3_MAX
from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.errors import ConfigError

KV_SCALE_HEADROOM = 2.0
"""How far above the largest calibrated magnitude E4M3 still reaches before it saturates."""
FORMAT = "atlas-kv-scales/1"
"""The ``format`` field of a scales file."""
CALIBRATION_TEXT = """\
The committee met on Tuesday to review the budget for the coming year. Revenue grew by 4.2 percent, while
costs rose faster than expected, mostly because of energy prices and new hires in the support team.

def merge_intervals(intervals):
    intervals.sort(key=lambda pair: pair[0])
    merged = []
    for start, end in intervals:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged

User: Can you explain why the sky is blue?
Assistant: Sunlight is scattered by the molecules of the air, and shorter wavelengths scatter much more
than longer ones (Rayleigh scattering), so blue light reaches our eyes from every direction of the sky.

| city | population | country |
|------|-----------:|---------|
| Lyon | 522,250 | France |
| Osaka | 2,753,862 | Japan |

El tren sale a las ocho y media. Der Zug fährt um halb neun ab. Le train part à huit heures et demie.
{"id": 17, "name": "sensor-4", "readings": [0.013, -2.5, 118.0, 3.14159], "ok": true}
"""
"""The default calibration prompt: prose, code, a dialogue, a table, several languages and JSON."""


def measure_kv_scales(llm: Any, prompts: list[list[int]]) -> list[tuple[float, float]]:
    """``(k_scale, v_scale)`` of every KV layer of ``llm``'s model (an `LLM` whose cache stores the activation dtype,
    unsplit; MTP layers, which keep their own scales, are not measured) after a forward over ``prompts``. Layers
    without their own values (MLA latent caches, which stay unscaled) get ``(1.0, 1.0)``."""
    kv = llm.engine.kv
    if any(scales is not None for scales in kv.scales):
        raise ConfigError("calibrate-kv measures a cache in the activation dtype: run it with kv_cache_dtype=auto")
    if llm.mirror is not None:
        raise ConfigError("calibrate-kv reads every head's keys on one process: run it unsplit (no parallel sizes)")
    llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0))
    return [
        (1.0, 1.0) if values is None else (_layer_scale(llm.backend, keys), _layer_scale(llm.backend, values))
        for keys, values in list(zip(kv.keys, kv.values, strict=True))[: len(llm.loaded.model.kv_layouts)]
    ]


def _layer_scale(backend: Any, cache: Any) -> float:
    """The scale of one layer's key or value cache: its largest magnitude (every block; unused ones are zeros)
    mapped to ``448 / KV_SCALE_HEADROOM``, or 1.0 for a cache of zeros."""
    amax = float(np.abs(backend.to_numpy(cache).astype(np.float32)).max())
    return float(np.float32(amax * KV_SCALE_HEADROOM / FP8_E4M3_MAX)) if amax > 0 else 1.0


def write_kv_scales(path: Path, scales: list[tuple[float, float]], model: str) -> None:
    """Write ``scales`` (one pair per KV layer) to ``path`` as JSON, with the model's name."""
    layers = [{"k_scale": k, "v_scale": v} for k, v in scales]
    document = {"format": FORMAT, "model": model, "headroom": KV_SCALE_HEADROOM, "layers": layers}
    path.write_text(json.dumps(document, indent=1) + "\n")


def read_kv_scales(path: str | Path, count: int) -> list[tuple[float, float]]:
    """The per-layer scales of a file `write_kv_scales` wrote, for a model of ``count`` KV layers; `ConfigError`
    naming the file and what is wrong (unreadable, another format, another layer count, a scale that is not a
    positive finite number)."""
    where = f"kv_cache_scales file {str(path)!r}"
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{where} cannot be read as JSON ({exc}); write one with `atlas calibrate-kv`") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ConfigError(f"{where} is not a {FORMAT} file (its 'format' field); write one with `atlas calibrate-kv`")
    layers = document.get("layers")
    if not isinstance(layers, list) or len(layers) != count:
        found = len(layers) if isinstance(layers, list) else "no"
        raise ConfigError(
            f"{where} has {found} layers but this model has {count} KV layers "
            f"(it was written for {document.get('model')!r}); calibrate this model"
        )
    scales = []
    for i, layer in enumerate(layers):
        pair = tuple(layer.get(name) if isinstance(layer, dict) else None for name in ("k_scale", "v_scale"))
        if not all(isinstance(v, int | float) and math.isfinite(v) and v > 0 for v in pair):
            raise ConfigError(f"{where}: layer {i} needs positive finite 'k_scale' and 'v_scale', got {layer!r}")
        scales.append((float(pair[0]), float(pair[1])))  # type: ignore[arg-type]
    return scales
