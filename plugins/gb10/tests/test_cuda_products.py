"""The cuda backend's dense products beyond the shared conformance suite: a row's bits do not depend on the batch
or where the row sits; the prefill kernels (gemm_tiled.cu, gemm_wgmma.cu on Hopper) against float64 with ragged
edges; the gated products (`gated_linear`) with the bits of the product followed by the gated kernel. Needs a CUDA
GPU; skipped with the backend's own reason elsewhere."""

from __future__ import annotations

import numpy as np
import pytest
from atlas_gb10.backend import CudaBackend
from atlas_gb10.hardware import has_wgmma
from atlas_gb10.prefill_products import prefill_product

from atlas_core.backends.base import Array

REASON = CudaBackend.availability()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"the cuda backend cannot run here: {REASON}")


@pytest.fixture(scope="module")
def backend() -> CudaBackend:
    return CudaBackend()


def host(backend: CudaBackend, x: object) -> np.ndarray:
    return np.asarray(backend.to_numpy(x)).astype(np.float64)


@pytest.mark.parametrize(("k", "n"), [(1024, 96), (4096, 1000), (33, 40)], ids=["vec", "wide", "unaligned"])
def test_gemm_rows_do_not_depend_on_the_batch(backend: CudaBackend, k: int, n: int) -> None:
    rng = np.random.default_rng(k + n)
    x = backend.from_numpy(rng.standard_normal((300, k), dtype=np.float32))
    w = backend.from_numpy(rng.standard_normal((n, k), dtype=np.float32) * k**-0.5, weight=True)
    bias = backend.from_numpy(rng.standard_normal(n, dtype=np.float32), weight=True)
    full = host(backend, backend.linear(x, w, bias))
    want = host(backend, x) @ host(backend, w).T + host(backend, bias)
    assert np.abs(full - want).max() <= 3e-2 * np.abs(want).max()
    for m in (1, 3, 8, 16, 17, 64, 129):
        part = host(backend, backend.linear(x[:m], w, bias))
        np.testing.assert_array_equal(part, full[:m], err_msg=f"rows of an M={m} product differ from M=300")
    moved = host(backend, backend.linear(x[[7, 250, 7]], w, bias))
    np.testing.assert_array_equal(moved, full[[7, 250, 7]], err_msg="a row's result depends on its position")


@pytest.mark.parametrize("name", ["gemm_tiled", "gemm_wgmma"])
@pytest.mark.parametrize(
    ("m", "n", "k"),
    [(1280, 4096, 1024), (1300, 2000, 2056), (1300, 4096, 2056)],
    ids=["aligned", "ragged", "ragged-tiles-a-block"],  # the last: 176 wgmma tiles, 33 K tiles each
)
def test_prefill_gemm_kernels(
    backend: CudaBackend, name: str, m: int, n: int, k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prefill products outside the batch-invariant mode, gemm_tiled.cu and (on Hopper) gemm_wgmma.cu, against
    float64 with a bias and ragged edges (M, N and K off their tiles); a row gets the same bits wherever it sits in
    the product; `linear` takes the kernel `prefill_gemm` names, not the batch-invariant one."""
    if name == "gemm_wgmma" and not has_wgmma(backend.profile.arch):
        pytest.skip(f"wgmma needs Hopper (sm_90a), this device compiles for {backend.profile.arch}")
    rng = np.random.default_rng(m + k)
    x = backend.from_numpy(rng.standard_normal((m, k), dtype=np.float32))
    w = backend.from_numpy(rng.standard_normal((n, k), dtype=np.float32) * k**-0.5, weight=True)
    bias = backend.from_numpy(rng.standard_normal(n, dtype=np.float32), weight=True)

    def product(first: int, kernel: str) -> np.ndarray:
        out = backend.cp.empty((m - first, n), dtype=x.dtype)
        return host(backend, prefill_product(backend, kernel, x[first:], k, w, bias, out, n, m - first, n, k))

    full = product(0, name)
    want = host(backend, x) @ host(backend, w).T + host(backend, bias)
    assert np.abs(full - want).max() <= 3e-2 * np.abs(want).max()
    np.testing.assert_array_equal(product(128, name), full[128:], err_msg="a row's bits depend on where it sits")
    chosen = backend.prefill_gemm(m, n, k)
    assert chosen is not None
    monkeypatch.setattr(backend, "batch_invariant", True)  # as an engine with batch_invariant=True sets it
    invariant = host(backend, backend.linear(x, w, bias))
    monkeypatch.setattr(backend, "batch_invariant", False)
    linear = host(backend, backend.linear(x, w, bias))
    np.testing.assert_array_equal(linear, product(0, chosen))
    assert not np.array_equal(linear, invariant), "the product took the batch-invariant kernel"


def check_gated_product(
    backend: CudaBackend,
    monkeypatch: pytest.MonkeyPatch,
    kernel: str,
    activation: str,
    m: int,
    inner: int,
    k: int,
    with_bias: bool,
) -> tuple[Array, Array, Array | None, np.ndarray]:
    """`gated_linear` of random (m, k) rows and 2 x ``inner`` weight rows, whose first gates lie far into both tails
    of the activation: it launches ``kernel`` alone, and its result has the bits of `linear` followed by the
    elementwise gated kernel. Returns x, the weight, the bias and the fused result on the host."""
    rng = np.random.default_rng(m + inner)
    x = backend.from_numpy(rng.standard_normal((m, k), dtype=np.float32))
    w_host = rng.standard_normal((2 * inner, k), dtype=np.float32) * k**-0.5
    w_host[:3] *= 60.0  # gates far into both tails of the activation
    w = backend.from_numpy(w_host, weight=True)
    bias = backend.from_numpy(rng.standard_normal(2 * inner, dtype=np.float32), weight=True) if with_bias else None
    kernels, function = backend.kernels, backend.kernels.function
    taken: list[str] = []
    monkeypatch.setattr(
        kernels, "function", lambda op, name, dtype="bf16": taken.append(name) or function(op, name, dtype)
    )
    fused = host(backend, backend.gated_linear(x, w, activation, bias))
    assert taken == [kernel]
    product = backend.linear(x, w, bias)
    gated = backend.silu_mul(product) if activation == "silu" else backend.gelu_tanh_mul(product)
    np.testing.assert_array_equal(fused, host(backend, gated))
    assert np.isfinite(fused).all()
    return x, w, bias, fused


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize(
    ("m", "inner", "k", "with_bias"),
    [(1280, 2048, 2048, False), (1300, 1000, 2056, True), (300, 1480, 2056, True)],
    ids=["aligned", "ragged", "few-rows"],  # ragged: units off the 64-wide tiles, M and K off theirs
)
def test_gated_prefill_products_give_the_unfused_bits(
    backend: CudaBackend, activation: str, m: int, inner: int, k: int, with_bias: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Hopper, `gated_linear` of a prefill-sized product takes gemm_wgmma.cu's gated kernel, whose epilogue
    gives the bits of the plain product followed by the elementwise gated kernel, saturated gates included."""
    if not has_wgmma(backend.profile.arch):
        pytest.skip(f"wgmma needs Hopper (sm_90a), this device compiles for {backend.profile.arch}")
    assert backend.prefill_gemm(m, 2 * inner, k) == "gemm_wgmma"
    check_gated_product(backend, monkeypatch, f"gemm_wgmma_{activation}_mul_bf16", activation, m, inner, k, with_bias)


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize(
    ("m", "inner", "k", "with_bias"), [(1, 14336, 4096, False), (3, 1000, 1024, True), (16, 1004, 136, False)]
)
def test_gated_decode_products_give_the_unfused_bits(
    backend: CudaBackend, activation: str, m: int, inner: int, k: int, with_bias: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decode-sized `gated_linear` takes gemm.cu's gated kernel (a block's gate and up n-tiles of the same 8
    units), with the bits of the product followed by the elementwise gated kernel, in the batch-invariant mode too;
    units off the 8-wide tiles included."""
    name = f"gemm_bf16_{activation}_mul_m1_n2_vec"
    x, w, bias, fused = check_gated_product(backend, monkeypatch, name, activation, m, inner, k, with_bias)
    monkeypatch.setattr(backend, "batch_invariant", True)
    np.testing.assert_array_equal(host(backend, backend.gated_linear(x, w, activation, bias)), fused)
