"""Backend conformance: quantized (FP8) weights through `Backend.upload_quantized`, `Backend.linear` and
the ``moe_experts`` op, against float64 oracles of the dequantization formula (``docs/quantization.md``).

A backend that lists ``fp8_e4m3`` in ``quantized_formats`` must keep the weight quantized (its bytes and
scales read back unchanged) and compute with its dequantized values; any other backend gets the
dequantized weight as an ordinary weight, and the ops see plain arrays. Either way the results are those
of the weight the backend holds. Fixtures and tolerances: ``atlas_core.testing.conformance``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from atlas_core.backends.base import Array
from atlas_core.backends.ops.moe import MoEOps
from atlas_core.testing.conformance import Case, backend, case  # noqa: F401 (fixtures)
from atlas_core.testing.quantized import reference_dequantize
from atlas_core.weights.quantized import FP8_E4M3, QuantizedWeight

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
SHAPES = {  # (shape, block): partial edge blocks, the published 128 x 128 with padding, per channel, per tensor
    "block16-partial": ((40, 72), (16, 16)),
    "block128-padded": ((136, 200), (128, 128)),
    "channel": ((24, 40), (1, 40)),
    "tensor": ((24, 40), (24, 40)),
}


def random_quantized(case: Case, shape: tuple[int, ...], block: tuple[int, int]) -> QuantizedWeight:
    """Finite float8 elements and positive scales giving weights of about ``K ** -0.5``."""
    data = (case.rng.standard_normal(shape) * 64).astype(E4M3)
    grid = (*shape[:-2], -(-shape[-2] // block[0]), -(-shape[-1] // block[1]))
    scales = (case.rng.uniform(0.5, 1.5, grid) / (64 * shape[-1] ** 0.5)).astype(np.float32)
    return QuantizedWeight(FP8_E4M3, data, scales, block, shape)


def held(case: Case, weight: Array | QuantizedWeight) -> np.ndarray:
    """The values the backend holds for an uploaded weight, in float64."""
    if isinstance(weight, QuantizedWeight):
        data, scales = case.raw(weight.data), case.raw(weight.scales)
        return reference_dequantize(data.view(E4M3), scales, weight.block).astype(np.float64)
    return case.host(weight)


def upload(case: Case, weight: QuantizedWeight) -> Array | QuantizedWeight:
    """`Backend.upload_quantized`, checking what a backend that executes the format must keep."""
    uploaded = case.backend.upload_quantized(weight)
    if case.backend.keeps_quantized(weight):
        assert isinstance(uploaded, QuantizedWeight), f"upload_quantized must keep {weight.format} {case.tag}"
        assert uploaded.shape == weight.shape and uploaded.block == weight.block
        case.assert_equal(case.raw(uploaded.data).view(np.uint8), weight.data.view(np.uint8), "quantized elements")
        case.assert_equal(case.raw(uploaded.scales), weight.scales, "quantized scales")
    else:
        assert not isinstance(uploaded, QuantizedWeight), f"{case.backend.name} got a weight it cannot run"
    return uploaded


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("name", list(SHAPES))
def test_linear_with_quantized_weight(case: Case, name: str, with_bias: bool) -> None:
    shape, block = SHAPES[name]
    weight = upload(case, random_quantized(case, shape, block))
    x_dev, x = case.upload(case.normal(7, shape[1]))
    bias_dev, bias = case.upload(case.normal(shape[0]), weight=True) if with_bias else (None, 0.0)
    want = x @ held(case, weight).T + bias
    with case.unchanged("linear", x=x_dev):
        case.check_out_variants(
            lambda out: case.backend.linear(x_dev, weight, bias_dev, out=out), want, f"linear[{name}]"
        )


@pytest.mark.parametrize("activation", ["silu", "relu2"])
def test_moe_experts_with_quantized_banks(case: Case, activation: str) -> None:
    experts, top_k, tokens, hidden, inter = 6, 2, 9, 40, 24
    in_rows = inter if activation == "relu2" else 2 * inter
    w_in = upload(case, random_quantized(case, (experts, in_rows, hidden), (16, 16)))
    w_out = upload(case, random_quantized(case, (experts, hidden, inter), (16, 16)))
    x_dev, x = case.upload(case.normal(tokens, hidden))
    ids = np.stack([case.rng.choice(experts, size=top_k, replace=False) for _ in range(tokens)]).astype(np.int32)
    ids_dev = case.backend.from_numpy(ids)
    weights_dev = case.backend.from_numpy(case.rng.uniform(0.1, 1.0, (tokens, top_k)), dtype=np.dtype(np.float32))
    weights = case.host(weights_dev)
    w_in_held, w_out_held = held(case, w_in), held(case, w_out)
    want = np.zeros((tokens, hidden))
    for t in range(tokens):
        for j, e in enumerate(ids[t]):
            h = w_in_held[e] @ x[t]
            if activation == "relu2":
                a = np.maximum(h, 0.0) ** 2
            else:
                gate, up = np.split(h, 2)
                a = gate / (1.0 + np.exp(-gate)) * up
            want[t] += weights[t, j] * (w_out_held[e] @ a)
    got = case.backend.ops(MoEOps).moe_experts(x_dev, w_in, w_out, weights_dev, ids_dev, activation)
    case.assert_close(got, want, f"moe_experts[{activation}] with quantized banks")
