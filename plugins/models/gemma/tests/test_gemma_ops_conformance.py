"""Backend conformance: the gemma ops (soft_cap, scale, add_scaled, gelu_tanh_gate, pool_patches, clamp) against
float64 oracles written from the op group's docstrings.

Fixtures, tolerances and the seed handling (``ATLAS_CONFORMANCE_SEED``) are in
``atlas_core.testing.conformance``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from atlas_model_gemma.ops import GemmaOps

from atlas_core.testing.conformance import Case, backend, case  # noqa: F401 (fixtures)


def gemma(case: Case) -> GemmaOps:
    """The backend's implementation of the gemma op group (native where one is registered)."""
    return case.backend.ops(GemmaOps)


SHAPES = {"decode": (1, 37), "rows": (6, 64), "heads": (5, 3, 8)}


def oracle_gelu_tanh(g: np.ndarray) -> np.ndarray:
    return 0.5 * g * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g**3)))


@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
@pytest.mark.parametrize("cap", [30.0, 2.5])
def test_soft_cap(case: Case, shape: tuple[int, ...], cap: float) -> None:
    x_host = case.normal(*shape, scale=2 * cap)
    x_host.reshape(-1)[:3] = [1e4, -1e4, 0.0]  # saturated both ways, and the fixed point
    x_dev, x = case.upload(x_host)
    with case.unchanged("soft_cap", x=x_dev):
        got = gemma(case).soft_cap(x_dev, cap)
    case.assert_close(got, cap * np.tanh(x / cap), f"soft_cap (cap={cap})")
    assert np.all(np.abs(case.host(got)) <= cap * (1 + case.tol.rtol)), f"soft_cap exceeds the cap {case.tag}"


@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_scale(case: Case, shape: tuple[int, ...]) -> None:
    factor = float(case.rng.uniform(-3.0, 60.0))
    x_dev, x = case.upload(case.normal(*shape, scale=2.0))
    with case.unchanged("scale", x=x_dev):
        got = gemma(case).scale(x_dev, factor)
    case.assert_close(got, x * np.float64(np.float32(factor)), f"scale (factor={factor})")


@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
@pytest.mark.parametrize("factor", [1.0, None], ids=["sum", "scaled"])
def test_add_scaled(case: Case, shape: tuple[int, ...], factor: float | None) -> None:
    factor = float(case.rng.uniform(0.3, 2.0)) if factor is None else factor
    x_dev, x = case.upload(case.normal(*shape, scale=2.0))
    y_dev, y = case.upload(case.normal(*shape))
    with case.unchanged("add_scaled", x=x_dev, y=y_dev):
        got = gemma(case).add_scaled(x_dev, y_dev, factor)
    case.assert_close(got, (x + y) * np.float64(np.float32(factor)), f"add_scaled (factor={factor})")


def test_add_scaled_of_strided_views(case: Case) -> None:
    """Per-layer inputs are read as ``inputs[:, layer]``: a strided view of a ``[T, L, P]`` array."""
    stacked_dev, stacked = case.upload(case.normal(4, 3, 8))
    y_dev, y = case.upload(case.normal(4, 8))
    got = gemma(case).add_scaled(stacked_dev[:, 1], y_dev, 0.5)
    case.assert_close(got, (stacked[:, 1] + y) * 0.5, "add_scaled of a strided view")


@pytest.mark.parametrize("shape", [(1, 13), (6, 32)], ids=["decode", "rows"])
def test_gelu_tanh_gate(case: Case, shape: tuple[int, ...]) -> None:
    gate_host = case.normal(*shape, scale=2.0)
    gate_host[0, :4] = [-100.0, -20.0, 20.0, 100.0]  # saturated gates must not produce NaN
    gate_dev, gate = case.upload(gate_host)
    up_dev, up = case.upload(case.normal(*shape))
    with case.unchanged("gelu_tanh_gate", gate=gate_dev, up=up_dev):
        got = gemma(case).gelu_tanh_gate(gate_dev, up_dev)
    case.assert_close(got, oracle_gelu_tanh(gate) * up, "gelu_tanh_gate")


def test_gelu_tanh_gate_agrees_with_gelu_tanh_mul(case: Case) -> None:
    """The split-operand form and `gelu_tanh_mul`'s one-array form are the same function."""
    gate_dev, gate = case.upload(case.normal(5, 16, scale=2.0))
    up_dev, up = case.upload(case.normal(5, 16))
    joined_dev, _ = case.upload(np.concatenate([gate, up], axis=-1).astype(np.float32))
    case.assert_values(
        case.host(gemma(case).gelu_tanh_gate(gate_dev, up_dev)),
        case.host(case.backend.gelu_tanh_mul(joined_dev)),
        "gelu_tanh_gate vs gelu_tanh_mul",
    )


@pytest.mark.parametrize(
    ("grids", "kernel"), [([(4, 4)], 2), ([(6, 6)] * 3, 3), ([(4, 4), (4, 4)], 1), ([(6, 9), (3, 12), (9, 3)], 3)]
)
def test_pool_patches(case: Case, grids: list[tuple[int, int]], kernel: int) -> None:
    x_dev, x = case.upload(case.normal(sum(r * c for r, c in grids), 8))
    with case.unchanged("pool_patches", x=x_dev):
        got = gemma(case).pool_patches(x_dev, grids, kernel)
    want, start = [], 0
    for rows, cols in grids:
        grid = x[start : start + rows * cols].reshape(rows, cols, 8)
        start += rows * cols
        for i in range(rows // kernel):
            for j in range(cols // kernel):
                block = grid[i * kernel : (i + 1) * kernel, j * kernel : (j + 1) * kernel]
                want.append(block.reshape(-1, 8).mean(axis=0))
    case.assert_close(got, np.stack(want), f"pool_patches ({grids}, kernel {kernel})")


@pytest.mark.parametrize(("low", "high"), [(-0.5, 0.8), (-np.inf, 0.0), (-np.inf, np.inf)])
def test_clamp(case: Case, low: float, high: float) -> None:
    x_dev, x = case.upload(case.normal(6, 16, scale=2.0))
    with case.unchanged("clamp", x=x_dev):
        got = gemma(case).clamp(x_dev, low, high)
    case.assert_close(got, np.clip(x, low, high), f"clamp [{low}, {high}]")
