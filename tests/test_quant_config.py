"""Reading quantized safetensors checkpoints: which ``quantization_config`` is accepted (anything else is
refused naming the method, config.json and what is supported), and how scale tensors of every layout
(per tensor, per channel, per block, float32 or bfloat16) become `QuantizedWeight`s."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from atlas_core.errors import ModelLoadError
from atlas_core.weights.quant_config import QuantizationScheme
from atlas_core.weights.quantized import QuantizedWeight, dequantize, quantize_fp8
from atlas_core.weights.safetensors_source import SafetensorsSource

FP8_BLOCK = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [16, 16]}


def compressed(strategy: str, **weights: Any) -> dict[str, Any]:
    group = {"num_bits": 8, "type": "float", "strategy": strategy, "dynamic": False} | weights
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": group}},
        "ignore": ["lm_head"],
    }


def checkpoint(folder: Path, quantization: dict[str, Any] | None, tensors: dict[str, np.ndarray]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {"model_type": "llama"}
    if quantization is not None:
        config["quantization_config"] = quantization
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize(
    "settings",
    [
        {"quant_method": "awq", "bits": 4},
        {"quant_method": "gptq", "bits": 4},
        {"quant_method": "bitsandbytes", "load_in_4bit": True},
        {"quant_method": "mxfp4"},
        {"bits": 8},
    ],
    ids=["awq", "gptq", "bitsandbytes", "mxfp4", "no-method"],
)
def test_other_methods_are_refused_naming_method_file_and_support(tmp_path: Path, settings: dict[str, Any]) -> None:
    folder = checkpoint(tmp_path / "m", settings, {"x": np.zeros(2, np.float32)})
    method = repr(settings.get("quant_method"))
    with pytest.raises(ModelLoadError) as caught:
        SafetensorsSource(folder)
    message = str(caught.value)
    assert str(folder / "config.json") in message
    assert f"quant_method {method} is not supported; supported: 'fp8'" in message
    assert "'compressed-tensors'" in message


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({**FP8_BLOCK, "fmt": "e5m2"}, "fmt 'e5m2' is not supported"),
        ({**FP8_BLOCK, "weight_block_size": [128]}, "weight_block_size must be two positive integers"),
        (compressed("group", group_size=128), "strategy 'group' is not supported"),
        (compressed("channel") | {"format": "pack-quantized"}, "format 'pack-quantized' is not supported"),
        (compressed("channel", type="int"), "8-bit 'int' weights are not supported"),
        (compressed("tensor_group", num_bits=4), "4-bit 'float' weights are not supported"),
        (compressed("channel") | {"sparsity_config": {"format": "sparse-24"}}, "sparsity_config"),
    ],
    ids=["e5m2", "bad-block", "group", "pack-quantized", "int8", "nvfp4", "sparse"],
)
def test_unsupported_variants_are_refused(settings: dict[str, Any], match: str) -> None:
    with pytest.raises(ModelLoadError, match=match):
        QuantizationScheme.from_config({"quantization_config": settings}, "folder/config.json")


def test_no_quantization_config_means_no_scheme() -> None:
    assert QuantizationScheme.from_config({"model_type": "llama"}) is None
    assert QuantizationScheme.from_config({"quantization_config": None}) is None


def stored(weight: QuantizedWeight, scale_dtype: Any = np.float32, shape: tuple[int, ...] | None = None) -> np.ndarray:
    scales = np.asarray(weight.scales).astype(scale_dtype)
    return scales if shape is None else scales.reshape(shape)


def test_scale_layouts_become_quantized_weights(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    values = rng.standard_normal((40, 50)).astype(np.float32)
    block, channel = quantize_fp8(values, (16, 16)), quantize_fp8(values, (1, 50))
    tensor = quantize_fp8(values, (40, 50))
    bf16 = quantize_fp8(values, (1, 50), scale_dtype=ml_dtypes.bfloat16)
    cases = {
        "block": (FP8_BLOCK, block, {"weight_scale_inv": stored(block)}),
        "tensor-scalar": ({"quant_method": "fp8"}, tensor, {"weight_scale": stored(tensor, shape=())}),
        "tensor-1": (compressed("tensor"), tensor, {"weight_scale": stored(tensor, shape=(1,))}),
        "channel-vector": (compressed("channel"), channel, {"weight_scale": stored(channel, shape=(40,))}),
        "channel-bf16": (compressed("channel"), bf16, {"weight_scale": stored(bf16, ml_dtypes.bfloat16)}),
        "ct-block": (compressed("block", block_structure=[16, 16]), block, {"weight_scale": stored(block)}),
    }
    for name, (settings, weight, scale) in cases.items():
        tensors = {"p.weight": np.asarray(weight.data), "n.weight": np.ones(4, ml_dtypes.bfloat16)}
        tensors |= {"p." + key: value for key, value in scale.items()}
        source = SafetensorsSource(checkpoint(tmp_path / name, settings, tensors))
        quantized = source.get_quantized("p.weight")
        assert isinstance(quantized, QuantizedWeight), name
        assert quantized.block == weight.block and quantized.scales.dtype == np.float32, name
        np.testing.assert_array_equal(dequantize(quantized), dequantize(weight), err_msg=name)
        np.testing.assert_array_equal(source.get("p.weight"), dequantize(weight), err_msg=name)
        assert source.get_quantized("n.weight") is None and source.get("n.weight").dtype == ml_dtypes.bfloat16


def test_float8_tensors_need_their_scale_and_a_config(tmp_path: Path) -> None:
    data = np.zeros((4, 4), ml_dtypes.float8_e4m3fn)
    source = SafetensorsSource(checkpoint(tmp_path / "no-scale", FP8_BLOCK, {"p.weight": data}))
    with pytest.raises(ModelLoadError, match="'p.weight' is stored as F8_E4M3 but its scale .*'p.weight_scale_inv'"):
        source.get("p.weight")
    source = SafetensorsSource(checkpoint(tmp_path / "no-config", None, {"p.weight": data}))
    with pytest.raises(ModelLoadError, match="stored as F8_E4M3 but config.json has no quantization_config"):
        source.get_quantized("p.weight")
    wrong = {"p.weight": data, "p.weight_scale_inv": np.ones((3, 3), np.float32)}
    source = SafetensorsSource(checkpoint(tmp_path / "wrong-grid", FP8_BLOCK, wrong))
    with pytest.raises(ModelLoadError, match=r"'p.weight' has shape \(3, 3\).*declared block sizes: \[16, 16\]"):
        source.get_quantized("p.weight")


@pytest.mark.parametrize(("bad", "shown"), [(np.nan, "nan"), (np.inf, "inf"), (-0.5, "-0.5")])
def test_a_corrupt_scale_is_a_load_error_naming_the_tensor(tmp_path: Path, bad: float, shown: str) -> None:
    weight = quantize_fp8(np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32), (16, 16))
    scales = stored(weight).copy()
    scales[1, 0] = bad
    tensors = {"p.weight": np.asarray(weight.data), "p.weight_scale_inv": scales}
    source = SafetensorsSource(checkpoint(tmp_path / "corrupt", FP8_BLOCK, tensors))
    with pytest.raises(
        ModelLoadError, match=rf"scale of 'p.weight' holds 1 invalid value\(s\) \(e.g. {shown};.*corrupt"
    ):
        source.get_quantized("p.weight")
