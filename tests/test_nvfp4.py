"""NVFP4 weights (`atlas_core.weights.nvfp4`): nibble order, the dequantization formula of both published
layouts, exact row moves (also across different global scales), dequantize-on-use in chunks, the fallback
on a backend without the format, which ``quantization_config`` / ``hf_quant_config.json`` are accepted or
refused, and that the committed fixtures are what ``scripts/make_nvfp4_checkpoints.py`` makes."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from atlas_core.backends import numpy_backend
from atlas_core.backends.numpy_backend import NumpyBackend
from atlas_core.errors import ModelLoadError
from atlas_core.testing.nvfp4 import reference_nvfp4
from atlas_core.weights.nvfp4 import NVFP4, nvfp4_weight, pack_e2m1, quantize_nvfp4, unpack_e2m1
from atlas_core.weights.quant_config import QuantizationScheme
from atlas_core.weights.quantized import QuantizedWeight, concat_rows, dequantize, stack_experts, take_rows
from atlas_core.weights.safetensors_source import SafetensorsSource
from tests.scripts_loader import load_script

E2M1 = np.dtype(ml_dtypes.float4_e2m1fn)


def make(rows: int, cols: int, seed: int, divide: bool = True) -> tuple[QuantizedWeight, tuple[Any, ...]]:
    """A random NVFP4 weight and its stored tensors ``(packed, scales, global scale)``."""
    values = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * (seed + 1)
    amax = float(np.abs(values).max())
    stored = quantize_nvfp4(values, 2688 / amax if divide else amax / 2688, divide=divide)
    factor = 1 / np.float64(stored[2][0]) if divide else np.float64(stored[2][0])
    return nvfp4_weight(stored[0], stored[1], factor), stored


def test_even_columns_sit_in_the_low_nibble() -> None:
    elements = np.array([[0.5, -6.0, 1.5, 0.0]], dtype=E2M1)
    packed = pack_e2m1(elements)
    np.testing.assert_array_equal(packed, [[0xF1, 0x03]])  # 0.5 = 0x1, -6 = 0xF; 1.5 = 0x3, 0 = 0x0
    np.testing.assert_array_equal(unpack_e2m1(packed).astype(np.float32), elements.astype(np.float32))


@pytest.mark.parametrize("divide", [True, False], ids=["compressed-tensors", "modelopt"])
def test_dequantize_is_the_published_formula(divide: bool) -> None:
    weight, (packed, scales, stored) = make(24, 64, 3, divide)
    assert weight.data.shape == (24, 32 + 4 + 8) and weight.nbytes == 24 * 44
    np.testing.assert_array_equal(dequantize(weight), reference_nvfp4(packed, scales, stored, divide))


def test_row_moves_are_exact_across_global_scales() -> None:
    (a, _), (b, _), (c, _) = make(16, 32, 0), make(8, 32, 1, divide=False), make(8, 32, 2)
    fused = concat_rows([a, b, c])
    assert isinstance(fused, QuantizedWeight) and fused.format == NVFP4
    parts = [dequantize(a), dequantize(b), dequantize(c)]
    np.testing.assert_array_equal(dequantize(fused), np.concatenate(parts))
    order = np.random.default_rng(0).permutation(32)
    np.testing.assert_array_equal(dequantize(take_rows(fused, order)), np.concatenate(parts)[order])  # type: ignore[arg-type]
    bank = stack_experts([b, c])
    assert isinstance(bank, QuantizedWeight)
    np.testing.assert_array_equal(dequantize(bank.expert(1)), parts[2])


def test_numpy_backend_keeps_it_and_dequantizes_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    weight, _ = make(40, 48, 4)
    backend = NumpyBackend()
    held = backend.upload_quantized(weight)
    assert isinstance(held, QuantizedWeight) and held.nbytes == weight.nbytes
    x = np.random.default_rng(1).standard_normal((3, 48)).astype(np.float32)
    want = x @ dequantize(weight).T
    np.testing.assert_allclose(backend.linear(x, held), want, rtol=1e-6, atol=1e-6)
    monkeypatch.setattr(numpy_backend, "DEQUANTIZE_ELEMENTS", 48 * 7)  # 7 rows at a time
    np.testing.assert_allclose(backend.linear(x, held), want, rtol=1e-6, atol=1e-6)


def test_a_backend_without_the_format_dequantizes_at_load() -> None:
    class Fp8Only(NumpyBackend):
        quantized_formats = frozenset({"fp8_e4m3"})

    weight, _ = make(16, 32, 5)
    uploaded = Fp8Only().upload_quantized(weight)
    assert not isinstance(uploaded, QuantizedWeight)
    np.testing.assert_array_equal(uploaded, dequantize(weight))


CT_GROUP = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}


def compressed(weights: dict[str, Any], fmt: str = "nvfp4-pack-quantized") -> dict[str, Any]:
    group = {"targets": ["Linear"], "weights": weights, "format": fmt}
    return {"quant_method": "compressed-tensors", "format": fmt, "config_groups": {"group_0": group}}


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        (compressed(CT_GROUP | {"group_size": 32}), "group_size 32 are not supported in format 'nvfp4-pack"),
        (compressed(CT_GROUP | {"num_bits": 8}), "8-bit 'float' weights with strategy 'tensor_group'"),
        (
            compressed(CT_GROUP)
            | {
                "config_groups": {
                    "a": {"weights": CT_GROUP, "format": "nvfp4-pack-quantized"},
                    "b": {"weights": CT_GROUP, "format": "float-quantized"},
                }
            },
            "mixing formats",
        ),
        ({"quant_method": "modelopt", "quant_algo": "FP8"}, "quant_algo 'FP8' of a ModelOpt checkpoint"),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 32}, "group_size 32 is not supported"),
    ],
    ids=["ct-group-32", "ct-8-bit", "ct-mixed", "modelopt-fp8", "modelopt-group-32"],
)
def test_unsupported_nvfp4_variants_are_refused(settings: dict[str, Any], match: str) -> None:
    with pytest.raises(ModelLoadError, match=match) as caught:
        QuantizationScheme.from_config({"quantization_config": settings}, "folder/config.json")
    assert "folder/config.json" in str(caught.value)


def test_both_layouts_are_read(tmp_path: Path) -> None:
    weight, (packed, scales, stored) = make(16, 32, 6)
    ct = tmp_path / "ct"
    ct.mkdir()
    (ct / "config.json").write_text(json.dumps({"quantization_config": compressed(CT_GROUP)}))
    tensors = {"p.weight_packed": packed, "p.weight_scale": scales, "p.weight_global_scale": stored}
    save_file(tensors | {"n.weight": np.ones(4, np.float32)}, str(ct / "model.safetensors"))
    source = SafetensorsSource(ct)
    assert "p.weight" in source and "p.weight" in list(source.names())
    np.testing.assert_array_equal(source.get("p.weight"), dequantize(weight))
    assert source.get_quantized("n.weight") is None and source.get_quantized("p.weight_scale") is None

    modelopt, (packed, scales, stored) = make(16, 32, 7, divide=False)
    folder = tmp_path / "modelopt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4"}}))
    tensors = {"p.weight": packed, "p.weight_scale": scales, "p.weight_scale_2": stored.reshape(())}
    save_file(tensors | {"p.input_scale": np.ones((), np.float32)}, str(folder / "model.safetensors"))
    np.testing.assert_array_equal(SafetensorsSource(folder).get("p.weight"), dequantize(modelopt))
    save_file({"p.weight": packed, "p.weight_scale": scales}, str(folder / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="stored without 'p.weight_scale_2'"):
        SafetensorsSource(folder).get("p.weight")
    (folder / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "W4A8_AWQ"}}))
    with pytest.raises(ModelLoadError, match="hf_quant_config.json: quantization.quant_algo 'W4A8_AWQ'"):
        SafetensorsSource(folder)


def generator() -> ModuleType:
    return load_script("make_nvfp4_checkpoints")


def test_fixtures_are_what_the_generator_makes_and_small() -> None:
    script = generator()
    assert script.stale_files() == [], "run: uv run python scripts/make_nvfp4_checkpoints.py"
    for spec in script.SPECS:
        assert sum(f.stat().st_size for f in spec.folder.iterdir()) <= 256 * 1024, spec.folder
