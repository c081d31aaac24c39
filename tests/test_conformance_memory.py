"""Backend conformance: memory ops (``from_numpy``/``to_numpy`` round trips, ``zeros``).

Fixtures, tolerances and the seed handling (``ATLAS_CONFORMANCE_SEED``) are in
``atlas_core.testing.conformance``.
"""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.testing.conformance import Case, backend, case  # noqa: F401 (fixtures)


# ---- memory ops ----------------------------------------------------------------------------------
def test_memory_round_trip(case: Case) -> None:
    floats = case.rng.standard_normal((3, 5))
    device, held = case.upload(floats)
    assert case.raw(device).dtype == case.dtype, f"from_numpy(float64) must give activation_dtype {case.tag}"
    case.assert_values(held, floats, "from_numpy/to_numpy float round trip")
    weight = case.raw(case.backend.from_numpy(floats.astype(np.float32), weight=True)).astype(np.float64)
    assert weight.shape == floats.shape and np.isfinite(weight).all(), (
        f"to_numpy of a weight (any storage dtype) must give its float values {case.tag}"
    )
    ids = case.rng.integers(-5, 1000, size=7)
    device_ids = case.backend.from_numpy(ids)
    assert case.raw(device_ids).dtype == np.int32, f"from_numpy(int64) must give int32 {case.tag}"
    case.assert_equal(case.host(device_ids), ids, "from_numpy/to_numpy int round trip")


@pytest.mark.parametrize("kind", ["activation", "int32"])
def test_zeros(case: Case, kind: str) -> None:
    dtype = case.dtype if kind == "activation" else np.dtype(np.int32)
    zeros = case.raw(case.backend.zeros((2, 3, 5), dtype))
    assert zeros.dtype == dtype and zeros.shape == (2, 3, 5), f"zeros gave {zeros.dtype}{zeros.shape} {case.tag}"
    case.assert_equal(zeros.astype(np.float64), np.zeros((2, 3, 5)), "zeros")
