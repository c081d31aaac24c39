"""Backend conformance: the Mamba-2 ops (causal_conv1d, mamba2_scan, mamba2_decode, gated_rms_norm,
relu_squared) against float64 oracles written from ``docs/ops.md``, the chunked scan against the
recurrent step, and `rope` with zero-width tables (the Mamba-2 hybrids' attention has no RoPE).

Inputs are strided views of one wider array, the way `Mamba2Mixer` slices them out of its input
projection. States start random (a sequence continuing from earlier chunks) in shuffled slots; slots
no sequence of the batch owns must come back bit for bit. Fixtures, tolerances and the seed handling
(``ATLAS_CONFORMANCE_SEED``) are in ``atlas_core.testing.conformance``.
"""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.backends.base import Array
from atlas_core.backends.numpy_backend import NumpyBackend
from atlas_core.backends.ops.mamba2 import Mamba2Ops
from atlas_core.testing.conformance import Case, backend, case, verify_checkpoints  # noqa: F401 (fixtures)

F32 = np.dtype(np.float32)


# ---- float64 oracles (token by token, head by head) ----------------------------------------------
def silu(v: np.ndarray) -> np.ndarray:
    return v / (1.0 + np.exp(-v))


def oracle_conv(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None,
    state: np.ndarray,
    starts: list[int],
    slots: list[int],
    checkpoints: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    kernel = weight.shape[1]
    out, state = np.zeros_like(x), state.copy()
    for b, slot in enumerate(slots):
        history = [state[slot][:, j] for j in range(kernel - 1)]  # oldest first
        for t in range(starts[b], starts[b + 1]):
            history.append(x[t])
            acc = np.zeros(x.shape[1]) if bias is None else bias.copy()
            for k in range(kernel):
                acc += history[len(history) - kernel + k] * weight[:, k]
            out[t] = silu(acc)
            if checkpoints is not None and checkpoints[t] >= 0:
                state[checkpoints[t]] = np.stack(history[-(kernel - 1) :], axis=1)
        state[slot] = np.stack(history[-(kernel - 1) :], axis=1)
    return out, state


def oracle_scan(
    x: np.ndarray,
    dt: np.ndarray,
    A: np.ndarray,
    B: np.ndarray,
    C: np.ndarray,
    D: np.ndarray,
    dt_bias: np.ndarray,
    state: np.ndarray,
    starts: list[int],
    slots: list[int],
    dt_min: float,
    dt_max: float,
    checkpoints: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    heads, groups = x.shape[1], B.shape[1]
    y, state = np.zeros_like(x), state.copy()
    for b, slot in enumerate(slots):
        s = state[slot]
        for t in range(starts[b], starts[b + 1]):
            for h in range(heads):
                g = h // (heads // groups)
                delta = min(max(np.log1p(np.exp(dt[t, h] + dt_bias[h])), dt_min), dt_max)
                s[h] = np.exp(delta * A[h]) * s[h] + delta * np.outer(x[t, h], B[t, g])
                y[t, h] = s[h] @ C[t, g] + D[h] * x[t, h]
            if checkpoints is not None and checkpoints[t] >= 0:
                state[checkpoints[t]] = s
    return y, state


def oracle_gated_rms_norm(
    x: np.ndarray, gate: np.ndarray, weight: np.ndarray, eps: float, group_size: int
) -> np.ndarray:
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for g0 in range(0, x.shape[1], group_size):
            h = x[t, g0 : g0 + group_size] * silu(gate[t, g0 : g0 + group_size])
            out[t, g0 : g0 + group_size] = h / np.sqrt(np.mean(h * h) + eps) * weight[g0 : g0 + group_size]
    return out


# ---- inputs ----------------------------------------------------------------------------------------
def views(case: Case, *parts: np.ndarray) -> list[tuple[Array, np.ndarray]]:
    """Each ``[T, ...]`` part as a strided view of consecutive column ranges of one ``[T, W]`` backend
    array (after 5 leading columns), as the mixer slices z, x/B/C and dt out of its projection."""
    tokens = parts[0].shape[0]
    widths = [int(np.prod(p.shape[1:])) for p in parts]
    wide = case.normal(tokens, 5 + sum(widths) + 3)
    offsets = np.cumsum([5, *widths])
    for part, start, width in zip(parts, offsets, widths, strict=False):
        wide[:, start : start + width] = part.reshape(tokens, width)
    wide_dev = case.backend.from_numpy(wide)
    result = []
    for part, start, width in zip(parts, offsets, widths, strict=False):
        view = wide_dev[:, start : start + width].reshape(part.shape)
        result.append((view, case.host(view)))
    return result


def batch_layout(case: Case, lengths: list[int], num_slots: int) -> tuple[Array, list[int], Array, list[int]]:
    """``query_start_loc`` and shuffled distinct ``state_slots`` (device and host) for ``lengths``."""
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    slots = case.rng.permutation(num_slots)[: len(lengths)].astype(np.int32)
    return case.backend.from_numpy(starts), starts.tolist(), case.backend.from_numpy(slots), slots.tolist()


def ssm_inputs(case: Case, tokens: int, heads: int, head_dim: int, groups: int, state: int) -> dict[str, np.ndarray]:
    return {
        "x": case.normal(tokens, heads, head_dim),
        "dt": case.normal(tokens, heads),
        "B": case.normal(tokens, groups, state),
        "C": case.normal(tokens, groups, state),
        "A": -np.exp(case.normal(heads, scale=0.5) - 0.5).astype(np.float32),
        "D": case.normal(heads),
        "dt_bias": case.normal(heads, scale=0.5),
    }


def float32(case: Case, host: np.ndarray) -> tuple[Array, np.ndarray]:
    """A float32 backend array (the per-head parameters and the SSM state are float32 on every backend)."""
    device = case.backend.from_numpy(host, dtype=F32)
    return device, case.host(device)


def assert_state(case: Case, got: Array, want: np.ndarray, before: np.ndarray, slots: list[int], what: str) -> None:
    """Owned slots match the oracle; every other slot is bit for bit what it was."""
    values = case.host(got)
    others = [s for s in range(len(before)) if s not in slots]
    case.assert_values(values[slots], want[slots], f"{what}: state rows of the batch's slots")
    case.assert_equal(values[others], before[others], f"{what}: state rows of other slots must not change")


# ---- causal_conv1d ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("lengths", "kernel", "bias"), [([1], 4, True), ([5, 1, 12], 4, True), ([3, 9], 2, False)])
def test_causal_conv1d(case: Case, lengths: list[int], kernel: int, bias: bool) -> None:
    channels, num_slots = 11, 6
    tokens = sum(lengths)
    ((x_dev, x),) = views(case, case.normal(tokens, channels, scale=2.0))
    w_dev, w = case.upload(case.normal(channels, kernel), weight=True)
    b_dev, b = case.upload(case.normal(channels), weight=True) if bias else (None, None)
    state_dev, state = case.upload(case.normal(num_slots, channels, kernel - 1))
    starts_dev, starts, slots_dev, slots = batch_layout(case, lengths, num_slots)
    want, want_state = oracle_conv(x, w, b, state, starts, slots)
    inputs = {"x": x_dev, "weight": w_dev} | ({"bias": b_dev} if bias else {})
    with case.unchanged("causal_conv1d", **inputs):
        got = case.backend.ops(Mamba2Ops).causal_conv1d(x_dev, w_dev, b_dev, state_dev, starts_dev, slots_dev)
    case.assert_close(got, want, "causal_conv1d output")
    assert case.raw(state_dev).dtype == case.dtype, f"causal_conv1d: conv state dtype changed {case.tag}"
    assert_state(case, state_dev, want_state, state, slots, "causal_conv1d")


def test_causal_conv1d_writes_checkpoints(case: Case) -> None:
    """A verify step (sequences of 3 and 4 tokens with checkpoints, a decode token and 9- and 70-token prefills
    without): each checkpoint row holds the window that ends with its token."""
    lengths, channels, kernel, num_slots = [3, 1, 9, 70, 4], 11, 4, 12
    ((x_dev, x),) = views(case, case.normal(sum(lengths), channels, scale=2.0))
    w_dev, w = case.upload(case.normal(channels, kernel), weight=True)
    b_dev, b = case.upload(case.normal(channels), weight=True)
    state_dev, state = case.upload(case.normal(num_slots, channels, kernel - 1))
    starts_dev, starts, slots_dev, slots = batch_layout(case, lengths, num_slots)
    free = [s for s in range(num_slots) if s not in slots]
    checkpoints = verify_checkpoints(lengths, [True, False, False, False, True], free)
    want, want_state = oracle_conv(x, w, b, state, starts, slots, checkpoints)
    got = case.backend.ops(Mamba2Ops).causal_conv1d(
        x_dev, w_dev, b_dev, state_dev, starts_dev, slots_dev, checkpoints=case.backend.from_numpy(checkpoints)
    )
    case.assert_close(got, want, "causal_conv1d output with checkpoints")
    assert_state(case, state_dev, want_state, state, [*slots, *checkpoints[checkpoints >= 0].tolist()], "checkpoints")


# ---- the selective scan ----------------------------------------------------------------------------
SCAN_CASES = {  # id -> (sequence lengths, heads, groups, chunk size, dt limits)
    "prefill-chunk16": ([33], 4, 2, 16, (0.0, np.inf)),
    "mixed-chunk3": ([7, 1, 20], 4, 1, 3, (0.0, np.inf)),
    "chunk1-groups-per-head": ([6, 2], 3, 3, 1, (0.0, np.inf)),
    "one-chunk-limits": ([17, 5], 4, 2, 64, (0.3, 0.9)),
}


@pytest.mark.parametrize("name", list(SCAN_CASES))
def test_mamba2_scan(case: Case, name: str) -> None:
    lengths, heads, groups, chunk, (dt_min, dt_max) = SCAN_CASES[name]
    head_dim, state_size, num_slots = 5, 8, 5
    host = ssm_inputs(case, sum(lengths), heads, head_dim, groups, state_size)
    (x_dev, x), (b_dev, b), (c_dev, c), (dt_dev, dt) = views(case, host["x"], host["B"], host["C"], host["dt"])
    (a_dev, a), (d_dev, d), (bias_dev, bias) = (float32(case, host[k]) for k in ("A", "D", "dt_bias"))
    state_dev, state = float32(case, case.normal(num_slots, heads, head_dim, state_size))
    starts_dev, starts, slots_dev, slots = batch_layout(case, lengths, num_slots)
    want, want_state = oracle_scan(x, dt, a, b, c, d, bias, state, starts, slots, dt_min, dt_max)
    with case.unchanged("mamba2_scan", x=x_dev, dt=dt_dev, B=b_dev, C=c_dev, A=a_dev, D=d_dev, dt_bias=bias_dev):
        got = case.backend.ops(Mamba2Ops).mamba2_scan(
            x_dev, dt_dev, a_dev, b_dev, c_dev, d_dev, bias_dev, state_dev, starts_dev, slots_dev, chunk, dt_min, dt_max
        )
    case.assert_close(got, want, f"mamba2_scan output ({name})")
    assert case.raw(state_dev).dtype == F32, f"mamba2_scan: the SSM state must stay float32 {case.tag}"
    assert_state(case, state_dev, want_state, state, slots, f"mamba2_scan ({name})")


def test_mamba2_scan_writes_checkpoints(case: Case) -> None:
    """A verify step: sequences of 3 and 4 tokens leave the state after each token but their last in checkpoint
    rows, beside a decode token and a 70-token prefill without checkpoints."""
    lengths, heads, groups, head_dim, state_size, num_slots = [3, 1, 70, 4], 4, 2, 8, 16, 12
    host = ssm_inputs(case, sum(lengths), heads, head_dim, groups, state_size)
    (x_dev, x), (b_dev, b), (c_dev, c), (dt_dev, dt) = views(case, host["x"], host["B"], host["C"], host["dt"])
    (a_dev, a), (d_dev, d), (bias_dev, bias) = (float32(case, host[k]) for k in ("A", "D", "dt_bias"))
    state_dev, state = float32(case, case.normal(num_slots, heads, head_dim, state_size))
    starts_dev, starts, slots_dev, slots = batch_layout(case, lengths, num_slots)
    free = [s for s in range(num_slots) if s not in slots]
    checkpoints = verify_checkpoints(lengths, [True, False, False, True], free)
    want, want_state = oracle_scan(x, dt, a, b, c, d, bias, state, starts, slots, 0.0, np.inf, checkpoints)
    got = case.backend.ops(Mamba2Ops).mamba2_scan(
        *(x_dev, dt_dev, a_dev, b_dev, c_dev, d_dev, bias_dev, state_dev, starts_dev, slots_dev, 16),
        checkpoints=case.backend.from_numpy(checkpoints),
    )
    case.assert_close(got, want, "mamba2_scan output with checkpoints")
    assert_state(case, state_dev, want_state, state, [*slots, *checkpoints[checkpoints >= 0].tolist()], "checkpoints")


@pytest.mark.parametrize(("batch", "groups"), [(1, 1), (4, 2)])
def test_mamba2_decode(case: Case, batch: int, groups: int) -> None:
    heads, head_dim, state_size, num_slots = 4, 6, 8, 7
    host = ssm_inputs(case, batch, heads, head_dim, groups, state_size)
    (x_dev, x), (b_dev, b), (c_dev, c), (dt_dev, dt) = views(case, host["x"], host["B"], host["C"], host["dt"])
    (a_dev, a), (d_dev, d), (bias_dev, bias) = (float32(case, host[k]) for k in ("A", "D", "dt_bias"))
    state_dev, state = float32(case, case.normal(num_slots, heads, head_dim, state_size))
    _, starts, slots_dev, slots = batch_layout(case, [1] * batch, num_slots)
    want, want_state = oracle_scan(x, dt, a, b, c, d, bias, state, starts, slots, 0.0, np.inf)
    with case.unchanged("mamba2_decode", x=x_dev, dt=dt_dev, B=b_dev, C=c_dev, A=a_dev, D=d_dev, dt_bias=bias_dev):
        got = case.backend.ops(Mamba2Ops).mamba2_decode(
            x_dev, dt_dev, a_dev, b_dev, c_dev, d_dev, bias_dev, state_dev, slots_dev
        )
    case.assert_close(got, want, "mamba2_decode output")
    assert_state(case, state_dev, want_state, state, slots, "mamba2_decode")


@pytest.mark.parametrize("chunk", [1, 3, 16])
def test_chunked_scan_equals_recurrent_steps(case: Case, chunk: int) -> None:
    """One 29-token sequence through `mamba2_scan` (in two pieces, the state carried between them)
    gives the outputs and final state of 29 `mamba2_decode` steps."""
    tokens, heads, head_dim, groups, state_size = 29, 4, 4, 2, 8
    host = ssm_inputs(case, tokens, heads, head_dim, groups, state_size)
    up = {k: case.backend.from_numpy(v, dtype=F32 if k in ("A", "D", "dt_bias") else None) for k, v in host.items()}
    initial = case.normal(2, heads, head_dim, state_size)
    chunked, stepped = (case.backend.from_numpy(initial.copy(), dtype=F32) for _ in range(2))
    slot = case.backend.from_numpy(np.array([1], dtype=np.int32))
    pieces = []
    for lo, hi in ((0, 11), (11, tokens)):
        starts = case.backend.from_numpy(np.array([0, hi - lo], dtype=np.int32))
        pieces.append(
            case.host(
                case.backend.ops(Mamba2Ops).mamba2_scan(
                    up["x"][lo:hi],
                    up["dt"][lo:hi],
                    up["A"],
                    up["B"][lo:hi],
                    up["C"][lo:hi],
                    up["D"],
                    up["dt_bias"],
                    chunked,
                    starts,
                    slot,
                    chunk,
                )
            )
        )
    steps = [
        case.host(
            case.backend.ops(Mamba2Ops).mamba2_decode(
                up["x"][t : t + 1],
                up["dt"][t : t + 1],
                up["A"],
                up["B"][t : t + 1],
                up["C"][t : t + 1],
                up["D"],
                up["dt_bias"],
                stepped,
                slot,
            )
        )
        for t in range(tokens)
    ]
    case.assert_values(np.concatenate(pieces), np.concatenate(steps), f"chunked (chunk {chunk}) vs recurrent outputs")
    case.assert_values(
        case.host(chunked)[1], case.host(stepped)[1], f"chunked (chunk {chunk}) vs recurrent final state"
    )
    case.assert_equal(case.host(chunked)[0], initial[0].astype(np.float64), "the other slot must not change")


# ---- elementwise -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("tokens", "width", "group_size"), [(1, 16, 16), (5, 24, 8), (3, 12, 3)])
def test_gated_rms_norm(case: Case, tokens: int, width: int, group_size: int) -> None:
    eps = float(case.rng.choice([1e-6, 1e-5]))
    x_host, gate_host = case.normal(tokens, width, scale=2.0), case.normal(tokens, width, scale=2.0)
    gate_host[0, :2] = [-100.0, 100.0]  # saturated gates must not produce NaN
    (gate_dev, gate), (x_dev, x) = views(case, gate_host, x_host)
    w_dev, w = case.upload(case.normal(width) + 1.0, weight=True)
    with case.unchanged("gated_rms_norm", x=x_dev, gate=gate_dev, weight=w_dev):
        got = case.backend.ops(Mamba2Ops).gated_rms_norm(x_dev, gate_dev, w_dev, eps, group_size)
    case.assert_close(
        got, oracle_gated_rms_norm(x, gate, w, eps, group_size), f"gated_rms_norm (groups of {group_size})"
    )


@pytest.mark.parametrize(("tokens", "width"), [(1, 13), (6, 32)])
def test_relu_squared(case: Case, tokens: int, width: int) -> None:
    x_dev, x = case.upload(case.normal(tokens, width, scale=3.0))
    with case.unchanged("relu_squared", x=x_dev):
        case.check_out_variants(
            lambda out: case.backend.ops(Mamba2Ops).relu_squared(x_dev, out=out),
            np.maximum(x, 0.0) ** 2,
            "relu_squared",
        )


def test_rope_with_zero_width_tables_rotates_nothing(case: Case) -> None:
    """Nemotron-H's attention has no position embedding: its loader passes rotary tables of width 0
    (partial rotary with R = 0), and `rope` must leave q and k exactly as they were."""
    tokens, heads, head_dim = 5, 4, 16
    positions = case.backend.from_numpy(case.rng.integers(0, 64, size=tokens).astype(np.int32))
    empty = case.backend.from_numpy(np.zeros((64, 0), dtype=np.float32), dtype=F32)
    q_dev, q = case.upload(case.normal(tokens, heads, head_dim))
    k_dev, k = case.upload(case.normal(tokens, heads // 2, head_dim))
    assert case.backend.rope(q_dev, k_dev, positions, empty, empty) is None, f"rope returns None {case.tag}"
    case.assert_equal(case.host(q_dev), q, "rope with zero-width tables: q")
    case.assert_equal(case.host(k_dev), k, "rope with zero-width tables: k")


class CopyingBackend(NumpyBackend):
    """Host arrays that behave like device memory: `to_numpy` and `from_numpy` always copy, so the host
    fallback's in-place ops only work if they write their result back."""

    name = "copying-numpy"

    def to_numpy(self, x: Array) -> np.ndarray:
        return np.array(x, copy=True)

    def from_numpy(self, array: np.ndarray, *, weight: bool = False, dtype: np.dtype | None = None) -> Array:
        return np.array(super().from_numpy(array, weight=weight, dtype=dtype), copy=True)


def test_host_fallback_writes_the_state_back() -> None:
    """On a backend without its own kernels, the in-place state updates reach the backend's arrays."""
    backend, rng = CopyingBackend(), np.random.default_rng(0)
    starts, slots = (
        backend.from_numpy(np.array([0, 3], dtype=np.int32)),
        backend.from_numpy(np.array([1], dtype=np.int32)),
    )
    conv_state = backend.zeros((2, 6, 3), np.float32)
    x = rng.standard_normal((3, 6)).astype(np.float32)
    backend.ops(Mamba2Ops).causal_conv1d(
        x, rng.standard_normal((6, 4)).astype(np.float32), None, conv_state, starts, slots
    )
    np.testing.assert_array_equal(conv_state[1], x.T)
    np.testing.assert_array_equal(conv_state[0], 0)
    ssm_state = backend.zeros((2, 2, 3, 4), np.float32)
    ones = np.ones(2, dtype=np.float32)
    args = (
        rng.standard_normal((3, 2, 3)).astype(np.float32),
        rng.standard_normal((3, 2)).astype(np.float32),
        -ones,
        rng.standard_normal((3, 1, 4)).astype(np.float32),
        rng.standard_normal((3, 1, 4)).astype(np.float32),
        ones,
        ones,
    )
    backend.ops(Mamba2Ops).mamba2_scan(*args, ssm_state, starts, slots, 2)
    assert np.abs(ssm_state[1]).max() > 0 and not ssm_state[0].any()
    before = ssm_state[1].copy()
    backend.ops(Mamba2Ops).mamba2_decode(*(a[:1] if a.ndim > 1 else a for a in args), ssm_state, slots)
    assert not np.array_equal(ssm_state[1], before)
