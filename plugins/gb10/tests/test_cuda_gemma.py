"""The cuda backend's kernels for the Gemma family's ``gemma`` op group beyond the shared conformance suite:
the native group is the one resolved, ops whose float32 arithmetic is exact give the reference's bits
(scale, add_scaled), and strided views of every layout the family passes (one layer's slice of the
stacked per-layer inputs, a 3-D stack, a view with a non-contiguous last axis) read the right elements.
Needs a CUDA GPU and the Gemma family plugin."""

from __future__ import annotations

import numpy as np
import pytest
from atlas_gb10.backend import CudaBackend

REASON = CudaBackend.availability()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"the cuda backend cannot run here: {REASON}")
ops_module = pytest.importorskip("atlas_model_gemma.ops", reason="the Gemma family plugin is not installed")


@pytest.fixture(scope="module")
def backend() -> CudaBackend:
    return CudaBackend()


@pytest.fixture(scope="module")
def gemma(backend: CudaBackend) -> object:
    ops = backend.ops(ops_module.GemmaOps)
    assert type(ops).__name__ == "CudaGemmaOps", "the cuda backend must resolve its native gemma implementation"
    return ops


def raw(backend: CudaBackend, x: object) -> np.ndarray:
    return np.asarray(backend.to_numpy(x))


def test_exact_ops_give_the_reference_bits_on_strided_views(backend: CudaBackend, gemma: object) -> None:
    rng = np.random.default_rng(0)
    tokens, layers, width = 37, 5, 24
    stacked = backend.from_numpy(rng.standard_normal((tokens, layers, width), dtype=np.float32) * 3)
    y = backend.from_numpy(rng.standard_normal((tokens, width), dtype=np.float32))
    transposed = backend.from_numpy(rng.standard_normal((width, tokens), dtype=np.float32)).T  # last axis strided
    for x in (stacked[:, 3], stacked, transposed):
        got = gemma.scale(x, 55.5)
        np.testing.assert_array_equal(raw(backend, got), ops_module.scale_reference(raw(backend, x), 55.5))
    for x, other in ((stacked[:, 1], y), (y, stacked[:, 4]), (transposed, y), (stacked, stacked)):
        got = gemma.add_scaled(x, other, 2.0**-0.5)
        want = ops_module.add_scaled_reference(raw(backend, x), raw(backend, other), 2.0**-0.5)
        np.testing.assert_array_equal(raw(backend, got), want)


def test_transcendental_ops_on_a_layer_slice(backend: CudaBackend, gemma: object) -> None:
    """gelu_tanh_gate reads its ``up`` operand as one layer's slice of the per-layer inputs."""
    rng = np.random.default_rng(1)
    tokens, layers, width = 9, 4, 40
    inputs = backend.from_numpy(rng.standard_normal((tokens, layers, width), dtype=np.float32))
    gate = backend.from_numpy(rng.standard_normal((tokens, width), dtype=np.float32) * 3)
    got = raw(backend, gemma.gelu_tanh_gate(gate, inputs[:, 2])).astype(np.float64)
    want = ops_module.gelu_tanh_gate_reference(raw(backend, gate), raw(backend, inputs)[:, 2]).astype(np.float64)
    assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max()
    logits = backend.from_numpy(rng.standard_normal((3, 1000), dtype=np.float32) * 40)
    capped = raw(backend, gemma.soft_cap(logits, 30.0)).astype(np.float64)
    assert np.abs(capped - 30.0 * np.tanh(raw(backend, logits).astype(np.float64) / 30.0)).max() <= 0.25
    assert np.abs(capped).max() <= 30.0
