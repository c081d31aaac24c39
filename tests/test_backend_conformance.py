"""Backend conformance: every installed backend, op by op, against float64 oracles written here.

The suite is parametrised over every ``backend`` registration of the plugin registry (test ids are
the backend names). A backend whose ``availability()`` gives a reason is skipped with that reason;
nothing else is ever skipped. The oracles below are deliberately plain (explicit loops, textbook
formulas) and never call a backend, so the NumPy reference backend is verified like any other.

Every test draws fresh random inputs. The seed is printed and quoted in every assertion message;
``ATLAS_CONFORMANCE_SEED=<seed>`` replays a failing run. Oracles read the inputs back from the
backend (``to_numpy(from_numpy(x))``), so rounding to a bf16/fp16 activation dtype is not counted
as error; tolerances then depend on the backend's ``activation_dtype`` (see ``docs/ops.md``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pytest

from atlas_core.backends.base import Array, AttentionMetadata, Backend, SamplingTensors
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
    "float16": Tolerance(rtol=1e-2, atol=1e-2, mass=5e-3, margin=1e-2),
    "bfloat16": Tolerance(rtol=4e-2, atol=4e-2, mass=5e-3, margin=1e-2),
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
    return int(fixed) if fixed else int(np.random.SeedSequence().entropy)


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


# ---- float64 oracles -----------------------------------------------------------------------------
def oracle_rms_norm(
    x: np.ndarray, weight: np.ndarray, eps: float, residual: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    summed = x if residual is None else x + residual
    rms = np.sqrt(np.mean(summed * summed, axis=-1, keepdims=True) + eps)
    return summed / rms * weight, summed


def oracle_silu_mul(x: np.ndarray) -> np.ndarray:
    gate, up = np.split(x, 2, axis=-1)
    return gate / (1.0 + np.exp(-gate)) * up


def oracle_rope(x: np.ndarray, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half on the first ``2 * cos.shape[1]`` dims of every head; the rest is copied."""
    half = cos.shape[1]
    out = x.copy()
    for t, pos in enumerate(positions):
        first, second = x[t, :, :half], x[t, :, half : 2 * half]
        out[t, :, :half] = first * cos[pos] - second * sin[pos]
        out[t, :, half : 2 * half] = second * cos[pos] + first * sin[pos]
    return out


def oracle_write_kv(cache: np.ndarray, new: np.ndarray, slots: np.ndarray) -> np.ndarray:
    block_size = cache.shape[1]
    out = cache.copy()
    for t, slot in enumerate(slots):
        if slot >= 0:
            out[slot // block_size, slot % block_size] = new[t]
    return out


def oracle_attention(
    q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, meta: AttentionMetadata, scale: float
) -> np.ndarray:
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // num_kv_heads
    out = np.full(q.shape, np.nan)
    for b in range(meta.num_seqs):
        start, end, ctx = int(meta.query_start_loc[b]), int(meta.query_start_loc[b + 1]), int(meta.seq_lens[b])
        table = meta.block_tables[b]
        keys = np.stack([k_cache[table[p // block_size], p % block_size] for p in range(ctx)])
        values = np.stack([v_cache[table[p // block_size], p % block_size] for p in range(ctx)])
        for i, row in enumerate(range(start, end)):
            visible = ctx - (end - start) + i + 1
            for head in range(q.shape[1]):
                kv_head = head // group
                scores = keys[:visible, kv_head] @ q[row, head] * scale
                weights = np.exp(scores - scores.max())
                out[row, head] = weights @ values[:visible, kv_head] / weights.sum()
    return out


def oracle_log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def oracle_argmax(logits: np.ndarray) -> np.ndarray:
    best = np.zeros(len(logits), dtype=np.int64)
    for r, row in enumerate(logits):
        for j in range(1, len(row)):
            if row[j] > row[best[r]]:
                best[r] = j
    return best


def _f32(value: float) -> float:
    return float(np.float32(value))


@dataclass(frozen=True)
class Knobs:
    """One row's sampling parameters (the defaults switch every filter off)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def as_float32(self) -> Knobs:
        """The values the backend sees (SamplingTensors carries float32)."""
        return Knobs(_f32(self.temperature), self.top_k, _f32(self.top_p), _f32(self.min_p))


def oracle_kept(row: np.ndarray, knobs: Knobs) -> tuple[list[int], np.ndarray, float]:
    """Token ids kept by the filters in draw order (descending probability, ties by lower id), their
    renormalised probabilities, and the smallest distance of any filter decision to its threshold."""
    knobs = knobs.as_float32()
    scaled = row / knobs.temperature
    p = np.exp(scaled - scaled.max())
    p /= p.sum()
    order = sorted(range(len(row)), key=lambda j: (-row[j], j))
    keep, closest = len(order), np.inf
    if knobs.top_k > 0:
        keep = min(keep, knobs.top_k)
    if knobs.top_p < 1.0:
        mass = 0.0
        for count, j in enumerate(order, start=1):
            mass += p[j]
            closest = min(closest, abs(mass - knobs.top_p))
            if mass >= knobs.top_p:
                break
        keep = min(keep, count)
    if knobs.min_p > 0.0:
        threshold = knobs.min_p * p[order[0]]
        keep = min(keep, sum(1 for j in order if p[j] >= threshold))
        closest = min([closest] + [abs(p[j] - threshold) for j in order[1:]])
    kept = order[:keep]
    return kept, p[kept] / p[kept].sum(), closest


def oracle_draw(kept: list[int], probs: np.ndarray, uniform: float) -> tuple[int, float]:
    """Inverse CDF: the first kept token whose cumulative mass exceeds ``uniform``; and the margin."""
    mass, closest = 0.0, np.inf
    for token, prob in zip(kept, probs, strict=True):
        mass += prob
        closest = min(closest, abs(mass - uniform))
        if mass > uniform:
            return token, closest
    return kept[-1], closest


def sampling_tensors(rows: int, knobs: list[Knobs] | Knobs, uniform: np.ndarray) -> SamplingTensors:
    per_row = knobs if isinstance(knobs, list) else [knobs] * rows
    return SamplingTensors(
        temperature=np.asarray([k.temperature for k in per_row], dtype=np.float32),
        top_k=np.asarray([k.top_k for k in per_row], dtype=np.int32),
        top_p=np.asarray([k.top_p for k in per_row], dtype=np.float32),
        min_p=np.asarray([k.min_p for k in per_row], dtype=np.float32),
        uniform=np.asarray(uniform, dtype=np.float32),
    )


# ---- memory ops ----------------------------------------------------------------------------------
def test_memory_round_trip(case: Case) -> None:
    floats = case.rng.standard_normal((3, 5))
    device, held = case.upload(floats)
    assert case.raw(device).dtype == case.dtype, f"from_numpy(float64) must give activation_dtype {case.tag}"
    case.assert_values(held, floats, "from_numpy/to_numpy float round trip")
    case.assert_values(case.upload(floats, weight=True)[1], floats, "from_numpy(weight=True) round trip")
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


# ---- dense ops -----------------------------------------------------------------------------------
@pytest.mark.parametrize("tokens", [1, 9])
def test_embedding(case: Case, tokens: int) -> None:
    vocab, hidden = 53, 24
    weight_dev, weight = case.upload(case.normal(vocab, hidden), weight=True)
    ids = case.rng.integers(0, vocab, size=tokens)
    if tokens > 2:
        ids[:3] = [0, vocab - 1, ids[-1]]  # both ends of the table and a repeat
    ids_dev, ids = case.upload(ids.astype(np.int32))
    with case.unchanged("embedding", weight=weight_dev, ids=ids_dev):
        case.assert_close(case.backend.embedding(weight_dev, ids_dev), weight[ids], "embedding")


@pytest.mark.parametrize(("tokens", "k", "n", "bias"), [(1, 33, 17, False), (7, 64, 24, True), (5, 1, 3, True)])
def test_linear(case: Case, tokens: int, k: int, n: int, bias: bool) -> None:
    x_dev, x = case.upload(case.normal(tokens, k))
    w_dev, w = case.upload(case.normal(n, k, scale=k**-0.5), weight=True)
    b_dev, b = case.upload(case.normal(n), weight=True) if bias else (None, np.zeros(n))
    inputs = {"x": x_dev, "weight": w_dev} | ({"bias": b_dev} if bias else {})
    with case.unchanged("linear", **inputs):
        case.check_out_variants(lambda out: case.backend.linear(x_dev, w_dev, b_dev, out=out), x @ w.T + b, "linear")


@pytest.mark.parametrize("shape", [(1, 32), (7, 33), (5, 3, 16)], ids=["decode", "odd", "per_head"])
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_rms_norm(case: Case, shape: tuple[int, ...], with_residual: bool) -> None:
    eps = float(case.rng.choice([1e-6, 1e-5]))
    x_host = case.normal(*shape, scale=3.0)
    residual_host = case.normal(*shape) if with_residual else None
    if shape[0] > 2:  # an all-zero row: only eps keeps it finite
        x_host[-1] = 0.0 if residual_host is None else -residual_host[-1]
    x_dev, x = case.upload(x_host)
    w_dev, w = case.upload(case.normal(shape[-1]) + 1.0, weight=True)
    r_dev, r = case.upload(residual_host) if with_residual else (None, None)
    want_normed, want_summed = oracle_rms_norm(x, w, eps, r)
    inputs = {"x": x_dev, "weight": w_dev} | ({"residual": r_dev} if with_residual else {})
    with case.unchanged("rms_norm", **inputs):
        normed, summed = case.backend.rms_norm(x_dev, w_dev, eps, r_dev)
    case.assert_close(normed, want_normed, f"rms_norm normed output (eps={eps})")
    case.assert_close(summed, want_summed, "rms_norm residual-stream output (x + residual)")


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize(("tokens", "inner"), [(1, 13), (6, 32)])
def test_silu_mul(case: Case, tokens: int, inner: int) -> None:
    x_host = case.normal(tokens, 2 * inner, scale=2.0)
    x_host[0, :4] = [-100.0, -20.0, 20.0, 100.0]  # saturated gates must not produce NaN
    x_dev, x = case.upload(x_host)
    with case.unchanged("silu_mul", x=x_dev):
        case.check_out_variants(lambda out: case.backend.silu_mul(x_dev, out=out), oracle_silu_mul(x), "silu_mul")


# ---- rotary embedding ----------------------------------------------------------------------------
MAX_POSITIONS = 64


@dataclass
class RopeTables:
    cos_dev: Array
    sin_dev: Array
    cos: np.ndarray
    sin: np.ndarray


def rope_tables(case: Case, rotary_dim: int) -> RopeTables:
    """``[MAX_POSITIONS, rotary_dim / 2]`` tables with a random attention factor already applied."""
    inv_freq = 10000.0 ** (-np.arange(0, rotary_dim, 2) / rotary_dim)
    angles = np.arange(MAX_POSITIONS)[:, None] * inv_freq[None, :]
    factor = case.rng.uniform(0.8, 1.3)
    cos_dev, cos = case.upload((np.cos(angles) * factor).astype(np.float32))
    sin_dev, sin = case.upload((np.sin(angles) * factor).astype(np.float32))
    return RopeTables(cos_dev, sin_dev, cos, sin)


@pytest.mark.parametrize(
    ("tokens", "q_heads", "kv_heads", "head_dim", "rotary_dim"),
    [(1, 4, 2, 16, 16), (7, 6, 2, 16, 8), (5, 3, 3, 12, 4), (4, 8, 2, 10, 6)],
    ids=["decode_full", "partial_half", "partial_third", "partial_odd_half"],
)
def test_rope(case: Case, tokens: int, q_heads: int, kv_heads: int, head_dim: int, rotary_dim: int) -> None:
    positions = case.rng.integers(0, MAX_POSITIONS, size=tokens)
    positions[0] = MAX_POSITIONS - 1
    positions[-1] = 0 if tokens > 1 else positions[-1]
    pos_dev, pos = case.upload(positions.astype(np.int32))
    tables = rope_tables(case, rotary_dim)
    q_dev, q = case.upload(case.normal(tokens, q_heads, head_dim))
    k_dev, k = case.upload(case.normal(tokens, kv_heads, head_dim))
    with case.unchanged("rope", positions=pos_dev, cos=tables.cos_dev, sin=tables.sin_dev):
        result = case.backend.rope(q_dev, k_dev, pos_dev, tables.cos_dev, tables.sin_dev)
    assert result is None, f"rope works in place and returns None {case.tag}"
    for name, got, before in (("q", q_dev, q), ("k", k_dev, k)):
        case.assert_close(got, oracle_rope(before, pos, tables.cos, tables.sin), f"rope {name}")
        case.assert_equal(case.host(got)[..., rotary_dim:], before[..., rotary_dim:], f"rope {name} tail dims")


# ---- paged KV cache ------------------------------------------------------------------------------
def skip_pattern(case: Case, tokens: int, pattern: str) -> np.ndarray:
    """Which tokens get slot -1: ``write``/``skip`` a lone token, or ``mixed`` (first token, one in
    the middle, and ~30% more are skipped; at least one is written)."""
    if pattern != "mixed":
        return np.full(tokens, pattern == "skip")
    skipped = case.rng.random(tokens) < 0.3
    skipped[[0, 2]], skipped[1] = True, False
    return skipped


@pytest.mark.parametrize(
    ("tokens", "kv_heads", "pattern"), [(1, 2, "write"), (1, 1, "skip"), (11, 2, "mixed"), (9, 1, "mixed")]
)
def test_write_kv(case: Case, tokens: int, kv_heads: int, pattern: str) -> None:
    num_blocks, block_size, head_dim = 6, 5, 8
    slots = case.rng.permutation(num_blocks * block_size)[:tokens]
    slots[skip_pattern(case, tokens, pattern)] = -1
    k_cache_dev, k_cache = case.upload(case.normal(num_blocks, block_size, kv_heads, head_dim))
    v_cache_dev, v_cache = case.upload(case.normal(num_blocks, block_size, kv_heads, head_dim))
    k_dev, k = case.upload(case.normal(tokens, kv_heads, head_dim))
    v_dev, v = case.upload(case.normal(tokens, kv_heads, head_dim))
    slots_dev, slots = case.upload(slots.astype(np.int32))
    with case.unchanged("write_kv", k=k_dev, v=v_dev, slot_mapping=slots_dev):
        result = case.backend.write_kv(k_cache_dev, v_cache_dev, k_dev, v_dev, slots_dev)
    assert result is None, f"write_kv works in place and returns None {case.tag}"
    for name, cache_dev, cache, new in (("k_cache", k_cache_dev, k_cache, k), ("v_cache", v_cache_dev, v_cache, v)):
        want = oracle_write_kv(cache, new, slots)
        case.assert_equal(case.host(cache_dev), want, f"write_kv {name} (slots {slots.tolist()}; -1 skips)")


@dataclass
class PagedBatch:
    """A varlen batch over shuffled, non-contiguous blocks. The caches hold random values everywhere
    (unused blocks and the tails of last blocks included), standing in for earlier steps' keys."""

    meta: AttentionMetadata
    positions: np.ndarray
    block_size: int
    k_cache_dev: Array
    v_cache_dev: Array
    k_cache: np.ndarray
    v_cache: np.ndarray
    scale: float

    def describe(self) -> str:
        return (
            f"block_size={self.block_size}, seq_lens={self.meta.seq_lens.tolist()}, "
            f"query_start_loc={self.meta.query_start_loc.tolist()}, block_tables={self.meta.block_tables.tolist()}"
        )


def attention_lengths(case: Case, scenario: str, block_size: int) -> list[tuple[int, int]]:
    """``(cached, new)`` tokens per sequence. ``mixed``: a decode token with a long context, a prefill
    chunk continuing a context and a fresh prompt, in random order, none ending on a block boundary."""
    def draw(low: int, high: int) -> int:
        return int(case.rng.integers(low, high))

    if scenario == "mixed":
        lengths = [(draw(30, 60), 1), (draw(7, 20), draw(4, 9)), (0, draw(5, 13))]
        lengths = [(cached + ((cached + new) % block_size == 0), new) for cached, new in lengths]
        return [lengths[i] for i in case.rng.permutation(len(lengths))]
    if scenario == "decode_t1":
        return [(draw(1, 40), 1)]
    if scenario == "decode_batch":  # a first token, and a context ending exactly on a block boundary
        return [(0, 1), (draw(1, 30), 1), (3 * block_size - 1, 1), (draw(20, 50), 1)]
    if scenario == "prefill":
        return [(0, draw(9, 17)), (0, 1)]
    raise ValueError(scenario)


def paged_batch(case: Case, scenario: str, kv_heads: int, head_dim: int) -> PagedBatch:
    block_size = int(case.rng.choice([3, 5, 7]))
    lengths = attention_lengths(case, scenario, block_size)
    seq_lens = [cached + new for cached, new in lengths]
    needed = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(needed) + 3
    pool = case.rng.permutation(num_blocks)
    tables = np.full((len(lengths), max(needed) + 1), -1, dtype=np.int32)
    slots, positions, starts = [], [], [0]
    for b, (cached, new) in enumerate(lengths):
        tables[b, : needed[b]] = pool[sum(needed[:b]) : sum(needed[: b + 1])]
        positions.extend(range(cached, cached + new))
        slots.extend(tables[b, p // block_size] * block_size + p % block_size for p in range(cached, cached + new))
        starts.append(starts[-1] + new)
    meta = AttentionMetadata(
        query_start_loc=np.asarray(starts, dtype=np.int32),
        seq_lens=np.asarray(seq_lens, dtype=np.int32),
        block_tables=tables,
        slot_mapping=np.asarray(slots, dtype=np.int32),
    )
    cache_shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache_dev, k_cache = case.upload(case.normal(*cache_shape))
    v_cache_dev, v_cache = case.upload(case.normal(*cache_shape))
    scale = float(case.rng.uniform(0.7, 1.5)) * head_dim**-0.5
    return PagedBatch(meta, np.asarray(positions), block_size, k_cache_dev, v_cache_dev, k_cache, v_cache, scale)


@pytest.mark.parametrize("group", [1, 2, 4], ids=["mha", "gqa2", "gqa4"])
@pytest.mark.parametrize("scenario", ["mixed", "decode_t1", "decode_batch", "prefill"])
def test_attention(case: Case, scenario: str, group: int) -> None:
    kv_heads, head_dim = 2, 16
    batch = paged_batch(case, scenario, kv_heads, head_dim)
    q_dev, q = case.upload(case.normal(len(batch.positions), kv_heads * group, head_dim, scale=1.5))
    want = oracle_attention(q, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    with case.unchanged("attention", q=q_dev, k_cache=batch.k_cache_dev, v_cache=batch.v_cache_dev):
        case.check_out_variants(
            lambda out: case.backend.attention(q_dev, batch.k_cache_dev, batch.v_cache_dev, batch.meta, batch.scale, out=out),
            want,
            f"attention ({scenario}, {batch.describe()})",
        )


@pytest.mark.parametrize("group", [1, 2, 4], ids=["mha", "gqa2", "gqa4"])
def test_attention_layer_pipeline(case: Case, group: int) -> None:
    """As the attention layer calls the ops: q/k/v are strided views of one fused QKV array, RoPE
    (partial) rotates q and k in place, write_kv stores this step's k/v, attention reads them back."""
    kv_heads, head_dim, rotary_dim = 2, 12, 8
    q_heads = kv_heads * group
    batch = paged_batch(case, "mixed", kv_heads, head_dim)
    tokens = len(batch.positions)
    qkv_dev, qkv = case.upload(case.normal(tokens, (q_heads + 2 * kv_heads) * head_dim))
    q_end, k_end = q_heads * head_dim, (q_heads + kv_heads) * head_dim
    views = {
        "q": qkv_dev[:, :q_end].reshape(tokens, q_heads, head_dim),
        "k": qkv_dev[:, q_end:k_end].reshape(tokens, kv_heads, head_dim),
        "v": qkv_dev[:, k_end:].reshape(tokens, kv_heads, head_dim),
    }
    tables = rope_tables(case, rotary_dim)
    positions_dev, positions = case.upload(batch.positions.astype(np.int32))
    slots_dev, slots = case.upload(batch.meta.slot_mapping)
    want = {
        "q": oracle_rope(qkv[:, :q_end].reshape(tokens, q_heads, head_dim), positions, tables.cos, tables.sin),
        "k": oracle_rope(qkv[:, q_end:k_end].reshape(tokens, kv_heads, head_dim), positions, tables.cos, tables.sin),
    }
    k_cache = oracle_write_kv(batch.k_cache, want["k"], slots)
    v_cache = oracle_write_kv(batch.v_cache, qkv[:, k_end:].reshape(tokens, kv_heads, head_dim), slots)

    case.backend.rope(views["q"], views["k"], positions_dev, tables.cos_dev, tables.sin_dev)
    case.assert_close(views["q"], want["q"], "rope on a strided q view")
    case.assert_close(views["k"], want["k"], "rope on a strided k view")
    case.assert_equal(case.host(qkv_dev)[:, k_end:], qkv[:, k_end:], "rope must not touch the v columns")
    case.backend.write_kv(batch.k_cache_dev, batch.v_cache_dev, views["k"], views["v"], slots_dev)
    case.assert_close(batch.k_cache_dev, k_cache, "write_kv from a strided k view")
    case.assert_close(batch.v_cache_dev, v_cache, "write_kv from a strided v view")
    got = case.backend.attention(views["q"], batch.k_cache_dev, batch.v_cache_dev, batch.meta, batch.scale)
    want_mixed = oracle_attention(want["q"], k_cache, v_cache, batch.meta, batch.scale)
    case.assert_close(got, want_mixed, f"attention on a strided q view ({batch.describe()})")


# ---- logits ops ----------------------------------------------------------------------------------
def tie_rows(case: Case, rows: int, vocab: int) -> np.ndarray:
    """Small integer logits (exact in every dtype) so the maximum is shared by several ids."""
    logits = case.rng.integers(-3, 3, size=(rows, vocab)).astype(np.float32)
    for row in logits:  # the row maximum at two far-apart ids at least
        row[case.rng.integers(0, vocab // 2)] = row[case.rng.integers(vocab // 2, vocab)] = 3.0
    return logits


def unique_max_rows(case: Case, rows: int, vocab: int) -> np.ndarray:
    logits = case.normal(rows, vocab, scale=2.0)
    logits[np.arange(rows), logits.argmax(axis=1)] += 1.0
    return logits


@pytest.mark.parametrize(("rows", "vocab", "offset"), [(1, 37, 0.0), (4, 1001, 300.0), (3, 40_003, -50.0)])
def test_log_softmax(case: Case, rows: int, vocab: int, offset: float) -> None:
    logits_dev, logits = case.upload(case.normal(rows, vocab, scale=3.0) + offset)
    with case.unchanged("log_softmax", logits=logits_dev):
        got = case.backend.log_softmax(logits_dev)
    case.assert_close(got, oracle_log_softmax(logits), "log_softmax", dtype=np.float32)
    values = case.host(got)
    lse = values.max(axis=-1) + np.log(np.exp(values - values.max(axis=-1, keepdims=True)).sum(axis=-1))
    case.assert_values(lse, np.zeros(rows), "log_softmax rows must logsumexp to 0")


@pytest.mark.parametrize(("rows", "vocab"), [(1, 37), (6, 257), (3, 40_003)])
def test_argmax(case: Case, rows: int, vocab: int) -> None:
    logits_host = np.concatenate([case.normal(rows, vocab), tie_rows(case, rows, vocab)])
    logits_dev, logits = case.upload(logits_host)
    with case.unchanged("argmax", logits=logits_dev):
        got = case.backend.argmax(logits_dev)
    case.assert_tokens(got, oracle_argmax(logits), "argmax (lowest index on ties)")


# ---- sampling ------------------------------------------------------------------------------------
def random_knobs(case: Case, vocab: int, *, greedy: bool) -> Knobs:
    def pick(options: list) -> float:
        return options[int(case.rng.integers(len(options)))]

    return Knobs(
        temperature=0.0 if greedy else pick([0.5, 1.0, 1.7]),
        top_k=pick([0, 1, 4, vocab + 3]),
        top_p=pick([1.0, 0.95, 0.6]),
        min_p=pick([0.0, 0.02, 0.2]),
    )


def test_sample_greedy_rows_are_argmax(case: Case) -> None:
    rows, vocab = 12, 64
    logits_dev, logits = case.upload(np.concatenate([case.normal(rows // 2, vocab), tie_rows(case, rows // 2, vocab)]))
    greedy = np.arange(rows) % 2 == 0
    knobs = [random_knobs(case, vocab, greedy=bool(g)) for g in greedy]
    params = sampling_tensors(rows, knobs, case.rng.random(rows))
    with case.unchanged("sample", logits=logits_dev):
        got = case.host(case.backend.sample(logits_dev, params))
    case.assert_equal(got[greedy], oracle_argmax(logits)[greedy], "sample: temperature 0 rows must be argmax")


ARGMAX_KNOBS = {
    "top_k=1": (dict(top_k=1), True),
    "top_p_tiny": (dict(top_p=1e-6), True),
    "min_p=1": (dict(min_p=1.0), False),  # a tied maximum would legitimately keep both ids
}


@pytest.mark.parametrize("knob", list(ARGMAX_KNOBS))
def test_sample_degenerate_filters_give_argmax(case: Case, knob: str) -> None:
    overrides, with_ties = ARGMAX_KNOBS[knob]
    rows, vocab = 16, 50
    parts = [unique_max_rows(case, rows, vocab)] + ([tie_rows(case, rows, vocab)] if with_ties else [])
    logits_dev, logits = case.upload(np.concatenate(parts))
    total = len(logits)
    knobs = [Knobs(temperature=float(case.rng.choice([0.3, 1.0, 3.0])), **overrides) for _ in range(total)]
    uniform = np.concatenate([[0.0, np.float32(1.0 - 2**-24)], case.rng.random(total - 2)])
    got = case.backend.sample(logits_dev, sampling_tensors(total, knobs, uniform))
    case.assert_tokens(got, oracle_argmax(logits), f"sample with {knob} must give argmax (lowest id on ties)")


def test_sample_matches_inverse_cdf_oracle(case: Case) -> None:
    """Random rows and filters; draws whose token depends on a comparison closer than ``tol.margin``
    to its threshold are redrawn so the exact-token check is robust to rounding."""
    rows, vocab = 32, 48
    logits_dev, logits = case.upload(case.normal(rows, vocab, scale=2.0))
    knobs, uniform, want = [], np.zeros(rows, dtype=np.float32), np.zeros(rows, dtype=np.int64)
    for r in range(rows):
        for _ in range(1000):
            row_knobs, u = random_knobs(case, vocab, greedy=False), np.float32(case.rng.random())
            kept, probs, filter_margin = oracle_kept(logits[r], row_knobs)
            token, draw_margin = oracle_draw(kept, probs, float(u))
            if min(filter_margin, draw_margin) > case.tol.margin:
                break
        else:
            pytest.fail(f"no unambiguous sampling draw for row {r} {case.tag}")
        knobs.append(row_knobs)
        uniform[r], want[r] = u, token
    got = case.backend.sample(logits_dev, sampling_tensors(rows, knobs, uniform))
    case.assert_tokens(got, want, f"sample vs inverse-CDF oracle (knobs={knobs}, uniform={uniform.tolist()})")


DISTRIBUTION_LOGITS = np.array([1.0, 2.5, -0.5, 0.75, 2.0, -1.5, 0.0, 1.5, -3.0, 0.25], dtype=np.float32)
DISTRIBUTION_KNOBS = {
    "plain": Knobs(),
    "temperature": Knobs(temperature=0.6),
    "top_k": Knobs(top_k=3),
    "top_p": Knobs(top_p=0.8),
    "min_p": Knobs(min_p=0.14),
    "combined": Knobs(temperature=1.3, top_k=6, top_p=0.88, min_p=0.22),
}


@pytest.mark.parametrize("name", list(DISTRIBUTION_KNOBS))
def test_sample_distribution(case: Case, name: str) -> None:
    """10,000 evenly spaced uniforms over one row reproduce the filtered, renormalised softmax."""
    knobs, draws = DISTRIBUTION_KNOBS[name], 10_000
    kept, probs, margin = oracle_kept(DISTRIBUTION_LOGITS.astype(np.float64), knobs)
    assert margin > 5e-3, f"test data too close to a filter threshold ({margin})"
    want = np.zeros(len(DISTRIBUTION_LOGITS))
    want[kept] = probs
    logits_dev = case.backend.from_numpy(np.tile(DISTRIBUTION_LOGITS, (draws, 1)))
    uniform = np.arange(draws) / draws
    got = case.host(case.backend.sample(logits_dev, sampling_tensors(draws, knobs, uniform)))
    assert got.min() >= 0 and got.max() < len(want), f"token ids out of range {case.tag}"
    frequencies = np.bincount(got, minlength=len(want)) / draws
    np.testing.assert_allclose(
        frequencies, want, rtol=0, atol=case.tol.mass, err_msg=f"sample distribution ({name}, {knobs}) {case.tag}"
    )
