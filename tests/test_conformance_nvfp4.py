"""NVFP4 weights on every installed backend: `Backend.upload_quantized` keeps them (a backend listing
``nvfp4``) or dequantizes them at load, and `linear` computes the product of the values the files define
(decoded by `atlas_core.testing.nvfp4.reference_nvfp4`, or the backend's dequantized copy)."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.testing.conformance import Case, backend, case  # noqa: F401 (fixtures)
from atlas_core.testing.nvfp4 import reference_nvfp4
from atlas_core.weights.nvfp4 import quantize_nvfp4
from atlas_core.weights.quant_config import QuantizationScheme
from atlas_core.weights.quantized import QuantizedWeight

SCHEMES = {
    "compressed-tensors": QuantizationScheme("compressed-tensors", ("_scale",), (), "test", "nvfp4"),
    "modelopt": QuantizationScheme("modelopt", ("_scale",), (), "test", "nvfp4"),
}


@pytest.mark.parametrize("method", list(SCHEMES))
def test_linear_with_nvfp4_weight(case: Case, method: str) -> None:
    divide = method == "compressed-tensors"
    values = case.rng.standard_normal((40, 64)) / 8.0
    amax = float(np.abs(values).max())
    packed, scales, stored = quantize_nvfp4(values, 2688 / amax if divide else amax / 2688, divide=divide)
    weight = SCHEMES[method].nvfp4_weight("w", packed, scales, stored)
    uploaded = case.backend.upload_quantized(weight)
    assert isinstance(uploaded, QuantizedWeight) == case.backend.keeps_quantized(weight), case.tag
    exact = reference_nvfp4(packed, scales, stored, divide).astype(np.float64)
    held = exact if isinstance(uploaded, QuantizedWeight) else case.host(uploaded)
    x_dev, x = case.upload(case.normal(7, 64))
    with case.unchanged("linear", x=x_dev):
        case.check_out_variants(lambda out: case.backend.linear(x_dev, uploaded, None, out=out), x @ held.T, "nvfp4")
