"""Backend conformance: the fixtures, tolerances and seeds of op-by-op checks against float64 oracles.

Core's suite (``tests/test_conformance_*.py``) and plugins' own op tests check every installed
backend with these fixtures: ``backend`` is parametrised over every ``backend`` registration of the
plugin registry (test ids are the backend names), and a backend whose ``availability()`` gives a
reason is skipped with that reason; nothing else is ever skipped. ``case`` gives each test a `Case`:
the backend, its `Tolerance` and a fresh random generator, with the checking helpers. Oracles are
deliberately plain (explicit loops, textbook formulas) and never call a backend, so the NumPy
reference backend is verified like any other; those several test modules share are in
`atlas_core.testing.oracles`.

Every test draws fresh random inputs. The seed is printed and quoted in every assertion message;
``ATLAS_CONFORMANCE_SEED=<seed>`` replays a failing run. Oracles read the inputs back from the
backend (``to_numpy(from_numpy(x))``), so rounding to a bf16/fp16 activation dtype is not counted
as error; tolerances then depend on the backend's ``activation_dtype`` (see ``docs/ops.md``).

Test modules import the fixtures explicitly::

    from atlas_core.testing.conformance import Case, backend, case  # noqa: F401 (fixtures)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pytest

from atlas_core.backends.base import Array, Backend
from atlas_core.plugins import Registration, get_registry

SEED_ENV = "ATLAS_CONFORMANCE_SEED"


# ---- tolerances ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tolerance:
    """Per activation dtype: ``|got - want| <= atol + rtol * |want|`` for values; ``mass`` bounds the
    error of sampled token frequencies; ``margin`` is how far (in probability mass) every decision
    of an exact-token sampling check must be from its threshold."""

    rtol: float
    atol: float
    mass: float
    margin: float


TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(rtol=1e-5, atol=1e-5, mass=1e-3, margin=1e-4),
    "float32": Tolerance(rtol=1e-5, atol=1e-5, mass=1e-3, margin=1e-4),
    "float16": Tolerance(rtol=5e-3, atol=5e-3, mass=5e-3, margin=1e-2),
    "bfloat16": Tolerance(rtol=3e-2, atol=3e-2, mass=5e-3, margin=1e-2),
}


# ---- the backend under test and per-test random state --------------------------------------------
BACKENDS: list[Registration] = get_registry().registrations("backend")


@pytest.fixture(scope="module", params=BACKENDS, ids=[r.name for r in BACKENDS])
def backend(request: pytest.FixtureRequest) -> Backend:
    registration: Registration = request.param
    backend_class = registration.load()
    reason = backend_class.availability()
    if reason is not None:
        pytest.skip(f"backend {registration.name!r} ({registration.plugin.label}) cannot run here: {reason}")
    return backend_class()


def _fresh_seed() -> int:
    fixed = os.environ.get(SEED_ENV)
    if fixed:
        return int(fixed)
    entropy = np.random.SeedSequence().entropy  # fresh from the OS: one int
    assert isinstance(entropy, int)
    return entropy


@dataclass
class Case:
    """One test's backend, tolerance and random generator, plus the shared checking helpers."""

    backend: Backend
    tol: Tolerance
    seed: int
    rng: np.random.Generator

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.backend.activation_dtype)

    @property
    def tag(self) -> str:
        return (
            f"[backend={self.backend.name} activation_dtype={self.dtype.name} seed={self.seed}; "
            f"replay with {SEED_ENV}={self.seed}]"
        )

    # -- data ---------------------------------------------------------------------------------------
    def normal(self, *shape: int, scale: float = 1.0) -> np.ndarray:
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)

    def raw(self, x: Array) -> np.ndarray:
        return np.asarray(self.backend.to_numpy(x))

    def host(self, x: Array) -> np.ndarray:
        """The backend array on the host, widened to float64 (floats) or int64 (integers)."""
        array = self.raw(x)
        return array.astype(np.int64 if array.dtype.kind in "iub" else np.float64)

    def upload(self, host: np.ndarray, *, weight: bool = False) -> tuple[Array, np.ndarray]:
        """``(backend array, what the backend holds as float64/int64)``: oracles use the latter."""
        device = self.backend.from_numpy(np.asarray(host), weight=weight)
        return device, self.host(device)

    def poisoned(self, shape: tuple[int, ...]) -> Array:
        return self.backend.from_numpy(np.full(shape, np.nan, dtype=np.float32))

    # -- checks -------------------------------------------------------------------------------------
    def assert_close(self, got: Array, want: np.ndarray, what: str, *, dtype: np.dtype | None = None) -> None:
        """A backend result: dtype as expected (activation dtype by default), values as `assert_values`."""
        raw = self.raw(got)
        expected_dtype = self.dtype if dtype is None else np.dtype(dtype)
        assert raw.dtype == expected_dtype, f"{what}: dtype {raw.dtype}, expected {expected_dtype} {self.tag}"
        self.assert_values(raw.astype(np.float64), want, what)

    def assert_values(self, values: np.ndarray, want: np.ndarray, what: str) -> None:
        """Within tolerance and finite wherever the oracle is finite (NaN never passes)."""
        assert values.shape == want.shape, f"{what}: shape {values.shape}, expected {want.shape} {self.tag}"
        broken = np.isfinite(want) & ~np.isfinite(values)
        assert not broken.any(), (
            f"{what}: {int(broken.sum())} NaN/Inf values where the oracle is finite, first at index "
            f"{tuple(int(i) for i in np.argwhere(broken)[0])} {self.tag}"
        )
        np.testing.assert_allclose(
            values, want, rtol=self.tol.rtol, atol=self.tol.atol, equal_nan=False, err_msg=f"{what} {self.tag}"
        )

    def assert_equal(self, values: np.ndarray, want: np.ndarray, what: str) -> None:
        """Bit-for-bit equality of host arrays (copies, token ids)."""
        assert values.shape == want.shape, f"{what}: shape {values.shape}, expected {want.shape} {self.tag}"
        mismatch = np.argwhere(values != want)
        assert len(mismatch) == 0, (
            f"{what}: {len(mismatch)} entries differ, first at {tuple(int(i) for i in mismatch[0])}: "
            f"got {values[tuple(mismatch[0])]}, expected {want[tuple(mismatch[0])]} {self.tag}"
        )

    def assert_tokens(self, got: Array, want: np.ndarray, what: str) -> None:
        raw = self.raw(got)
        assert raw.dtype == np.int32, f"{what}: dtype {raw.dtype}, expected int32 {self.tag}"
        self.assert_equal(raw.astype(np.int64), np.asarray(want, dtype=np.int64), what)

    def check_out_variants(self, op: Callable[[Array | None], Array], want: np.ndarray, what: str) -> None:
        """Run ``op`` without ``out`` and with a NaN-poisoned ``out``: both match the oracle, and the
        ``out`` buffer is the returned object and is fully overwritten."""
        self.assert_close(op(None), want, what)
        out = self.poisoned(want.shape)
        result = op(out)
        assert result is out, f"{what}: with out=, the out buffer must be returned {self.tag}"
        self.assert_close(out, want, f"{what} (out= poisoned with NaN)")

    @contextmanager
    def unchanged(self, what: str, **inputs: Array) -> Iterator[None]:
        """Inputs of a non-in-place op must read back identical afterwards."""
        before = {name: self.host(x) for name, x in inputs.items()}
        yield
        for name, x in inputs.items():
            self.assert_equal(self.host(x), before[name], f"{what}: input {name!r} was modified")


def _tolerance(backend: Backend) -> Tolerance:
    name = np.dtype(backend.activation_dtype).name
    if name not in TOLERANCES:
        pytest.fail(f"no conformance tolerance for activation dtype {name!r}; add one to TOLERANCES")
    return TOLERANCES[name]


@pytest.fixture
def case(backend: Backend) -> Case:
    seed = _fresh_seed()
    print(f"conformance seed {seed} (replay with {SEED_ENV}={seed})")
    return Case(backend, _tolerance(backend), seed, np.random.default_rng(seed))


def verify_checkpoints(lengths: list[int], verifying: list[bool], rows: list[int]) -> np.ndarray:
    """The per-token ``checkpoints`` of the recurrent ops (`atlas_core.backends.ops.checkpoints`) for a verify
    step over sequences of ``lengths`` tokens: each sequence with ``verifying[b]`` writes its state after every
    token but its last into the next of ``rows``; every other token has -1. int32 ``[sum(lengths)]``."""
    out, free = [], iter(rows)
    for length, checks in zip(lengths, verifying, strict=True):
        out += [next(free) for _ in range(length - 1)] + [-1] if checks and length else [-1] * length
    return np.asarray(out, dtype=np.int32)
