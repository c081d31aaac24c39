"""The example plugin's ``example_rms_norm`` layer on every installed backend, against a float64
oracle, with Atlas's conformance fixtures (``backend`` runs the module once per backend; ``case``
gives each test fresh random inputs, the backend's tolerance and a replayable seed)."""

from __future__ import annotations

import numpy as np
import pytest
from atlas_example_plugin.layers import CountingRMSNorm

from atlas_core.testing.conformance import Case, backend, case  # noqa: F401 (fixtures)


def oracle_rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """``x / sqrt(mean(x**2) + eps) * weight`` over the last axis, row by row."""
    out = np.empty_like(x)
    for t, row in enumerate(x):
        out[t] = row / np.sqrt(np.mean(row**2) + eps) * weight
    return out


@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_counting_norm_matches_the_oracle_and_counts(case: Case, with_residual: bool) -> None:
    x_dev, x = case.upload(case.normal(5, 48))
    w_dev, w = case.upload(1 + case.normal(48, scale=0.1), weight=True)
    r_dev, r = case.upload(case.normal(5, 48)) if with_residual else (None, np.zeros_like(x))
    calls = CountingRMSNorm.calls

    normed, summed = CountingRMSNorm(case.backend, w_dev, 1e-6)(x_dev, r_dev)

    assert CountingRMSNorm.calls == calls + 1
    case.assert_close(normed, oracle_rms_norm(x + r, w, 1e-6), "example_rms_norm output")
    case.assert_close(summed, x + r, "example_rms_norm residual stream")
