"""Checks for NVFP4 checkpoints: the oracle is the checkpoint's own weights dequantized from the files.

`dequantized_nvfp4_copy` writes a float32 copy of an NVFP4 checkpoint (compressed-tensors
``nvfp4-pack-quantized`` or ModelOpt ``NVFP4``) whose every quantized weight is decoded here from the
published definitions, independently of `atlas_core.weights.nvfp4`: a lookup table of the 16 E2M1 codes,
the even column in a byte's low nibble, the group scale in float32 divided by compressed-tensors'
``weight_global_scale`` or multiplied by ModelOpt's ``weight_scale_2``, times the element. `Nvfp4Parity`
runs `atlas_core.testing.quantized.QuantizedParity`'s logits and greedy-token checks against it and checks
that the weights stay NVFP4 in memory (file bytes plus 8 a row)::

    class TestNvfp4Parity(Nvfp4Parity):
        checkpoints = TinyCheckpoints(Path(__file__).parent / "fixtures" / "nvfp4")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from atlas_core import LLM
from atlas_core.testing.quantized import QuantizedParity, quantized_weights, read_tensors

E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)
"""The value of each 4-bit E2M1 code (bit 3 the sign)."""


def _settings(folder: Path) -> tuple[dict[str, Any], str]:
    """``(config.json, method)``: ``"compressed-tensors"`` or ``"modelopt"``."""
    config = json.loads((folder / "config.json").read_text())
    settings = config.get("quantization_config") or {}
    if settings.get("quant_method") == "compressed-tensors":
        return config, "compressed-tensors"
    return config, "modelopt"


def reference_nvfp4(packed: np.ndarray, scale: np.ndarray, global_scale: np.ndarray, divide: bool) -> np.ndarray:
    """float32 ``[..., N, K]`` from packed uint8 ``[..., N, K / 2]``, E4M3 scales ``[..., N, K / 16]`` and the
    global scale: ``e2m1 * (scale / global)`` (``divide``) or ``e2m1 * (scale * global)``, in float32."""
    codes = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
    elements = E2M1_VALUES[codes]
    group = scale.astype(np.float32)
    factor = np.float32(np.asarray(global_scale, dtype=np.float32).reshape(-1)[0])
    group = group / factor if divide else group * factor
    return elements * np.repeat(group, 16, axis=-1)


def dequantized_nvfp4_copy(folder: Path, destination: Path) -> Path:
    """A float32 copy of NVFP4 checkpoint ``folder`` in ``destination``: every quantized weight decoded by
    `reference_nvfp4` and stored as ``<module>.weight``, its scale tensors and activation scales dropped,
    every other tensor as float32, config.json without its ``quantization_config``."""
    config, method = _settings(folder)
    tensors = read_tensors(folder)
    ct = method == "compressed-tensors"
    out: dict[str, np.ndarray] = {}
    used: set[str] = set()
    for name, value in tensors.items():
        weight = name.removesuffix("_packed") if ct else name
        if value.dtype != np.uint8 or (ct and weight == name) or weight + "_scale" not in tensors:
            continue
        global_name = weight + ("_global_scale" if ct else "_scale_2")
        out[weight] = reference_nvfp4(value, tensors[weight + "_scale"], tensors[global_name], divide=ct)
        used |= {name, weight + "_scale", global_name}
    activation = (".input_global_scale", ".input_scale")
    for name, value in tensors.items():
        if name not in used and name not in out and not name.endswith(activation):
            out[name] = value.astype(np.float32)
    destination.mkdir(parents=True, exist_ok=True)
    config.pop("quantization_config", None)
    config["dtype"] = "float32"
    (destination / "config.json").write_text(json.dumps(config))
    save_file(out, str(destination / "model.safetensors"))
    return destination


def stored_nvfp4(folder: Path) -> tuple[int, int]:
    """``(elements, bytes)`` of the NVFP4 weights ``folder`` stores: packed elements and group scales."""
    tensors = read_tensors(folder)
    _, method = _settings(folder)
    elements = stored = 0
    for name, value in tensors.items():
        weight = name.removesuffix("_packed") if method == "compressed-tensors" else name
        if value.dtype == np.uint8 and weight + "_scale" in tensors:
            elements += value.size * 2
            stored += value.nbytes + tensors[weight + "_scale"].nbytes
    return elements, stored


class Nvfp4Parity(QuantizedParity):
    """`QuantizedParity` for NVFP4 checkpoints (one test per checkpoint of ``checkpoints``)."""

    def reference_copy(self, folder: Path, destination: Path) -> Path:
        return dequantized_nvfp4_copy(folder, destination)

    def test_quantized_weights_stay_quantized(self, checkpoint: str) -> None:
        folder = self.checkpoints / checkpoint
        llm = LLM(folder, kv_cache_memory_gib=self.kv_cache_gib)
        held = quantized_weights(llm.loaded.model)
        assert held and all(w.format == "nvfp4" and np.asarray(w.data).dtype == np.uint8 for w in held)
        elements, stored = stored_nvfp4(folder)
        rows = sum(int(np.prod(w.shape[:-1])) for w in held)
        assert sum(int(np.prod(w.shape)) for w in held) == elements, f"{checkpoint}: some weights were dequantized"
        assert sum(w.nbytes for w in held) == stored + 8 * rows, checkpoint
