"""The cuda backend's recurrent-layer ops (groups ``gated_delta`` and ``mamba2``) beyond the shared
conformance suite: the real models' head sizes, prompts of 1, 3, 63, 64, 65 and 200 tokens (on and off
the reference's 64-token chunks) against the NumPy references' chunked forms, in both forms of the delta
rule and of the Mamba-2 scan (recurrent: the batch-invariant mode and short sequences; chunked on the
tensor cores: sequences of 64 tokens or more otherwise), a sequence fed in prefill chunks and decode steps
giving the bits of one call (recurrent form) or its values (chunked form), rows that do not depend on the
batch, the two convolution paths agreeing bit for bit, and padding slots (-1) that read and write no state.
Needs a CUDA GPU."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from atlas_gb10.backend import CudaBackend
from atlas_gb10.gated_delta import normed_kernel
from atlas_gb10.recurrent import chunked_kernel

from atlas_core.backends.ops.gated_delta import (
    GatedDeltaOps,
    OutputNorm,
    gated_delta_rule_reference,
    rms_norm_silu_gate_reference,
)
from atlas_core.backends.ops.mamba2 import (
    Mamba2Ops,
    causal_conv1d_reference,
    gated_rms_norm_reference,
    mamba2_scan_reference,
)

REASON = CudaBackend.availability()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"the cuda backend cannot run here: {REASON}")

F32 = np.dtype(np.float32)
LENGTHS = [1, 3, 63, 64, 65, 200]
PIECES = [(0, 1), (1, 64), (64, 65), (65, 130), (130, 197), (197, 198), (198, 199), (199, 200)]
"""A 200-token sequence as prefill chunks crossing 64-token boundaries, then three decode steps."""


MODES = ["recurrent", "chunked"]
"""The delta rule's forms: ``recurrent`` is the batch-invariant mode (every sequence one token at a time),
``chunked`` the default one (sequences of 64 tokens or more on the tensor cores)."""
CHUNKED_STATE_TOLERANCE = 1e-2
"""Relative bound of the chunked form's state against the float32 reference: its products round their
operands (the state entering a chunk, T, delta) to bf16, as flash-linear-attention's kernels do."""


@pytest.fixture(scope="module")
def backend() -> CudaBackend:
    return CudaBackend()


@contextmanager
def mode(backend: CudaBackend, name: str) -> Iterator[None]:
    """The backend in the batch-invariant mode for ``recurrent``, in the default mode for ``chunked``."""
    backend.batch_invariant = name == "recurrent"
    try:
        yield
    finally:
        backend.batch_invariant = False


def host(backend: CudaBackend, x: Any) -> np.ndarray:
    return np.asarray(backend.to_numpy(x)).astype(np.float32)


def close(got: np.ndarray, want: np.ndarray, what: str, rel: float = 2e-2) -> None:
    """``got`` within ``rel`` of ``want``'s largest magnitude (bf16 outputs of fp32 math)."""
    error, scale = float(np.abs(got - want).max()), max(1.0, float(np.abs(want).max()))
    assert error <= rel * scale, f"{what}: max error {error:.3g} at scale {scale:.3g}"


def layout(backend: CudaBackend, lengths: list[int], slots: list[int]) -> tuple[Any, Any]:
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return backend.from_numpy(starts), backend.from_numpy(np.asarray(slots, dtype=np.int32))


# ---- gated delta rule ------------------------------------------------------------------------------
class Delta:
    """Inputs of one gated-delta layer, by default at the real models' head sizes (Dk = Dv = 128), q/k/v as
    strided views of one projection, g and beta from `gdn_gates`, and a nonzero state of 4 slots."""

    def __init__(
        self,
        backend: CudaBackend,
        tokens: int,
        seed: int,
        key_heads: int = 2,
        value_heads: int = 4,
        dims: tuple[int, int] = (128, 128),
    ) -> None:
        rng = np.random.default_rng(seed)
        self.backend, (self.dk, dv) = backend, dims
        qk = key_heads * self.dk
        width = 2 * qk + value_heads * dv
        mixed = backend.from_numpy(rng.standard_normal((tokens, width + 16), dtype=np.float32))
        self.q = mixed[:, :qk].reshape(tokens, key_heads, self.dk)
        self.k = mixed[:, qk : 2 * qk].reshape(tokens, key_heads, self.dk)
        self.v = mixed[:, 2 * qk : width].reshape(tokens, value_heads, dv)
        self.g = backend.from_numpy(-rng.uniform(0.0, 1.5, (tokens, value_heads)).astype(np.float32), dtype=F32)
        self.beta = backend.from_numpy(rng.uniform(0.0, 1.0, (tokens, value_heads)).astype(np.float32), dtype=F32)
        self.initial = (rng.standard_normal((4, value_heads, self.dk, dv)) * 0.3).astype(np.float32)

    def state(self) -> Any:
        return self.backend.from_numpy(self.initial.copy(), dtype=F32)

    def chunked(self) -> object:
        """The chunked kernel a call over these inputs takes in the current mode (None: the recurrent form)."""
        return chunked_kernel(self.backend, "gated_delta", (self.q, self.k, self.v), self.dk, self.v.shape[2], 1)

    def run(self, state: Any, rows: slice, lengths: list[int], slots: list[int]) -> Any:
        ops = self.backend.ops(GatedDeltaOps)
        starts, slot_ids = layout(self.backend, lengths, slots)
        return ops.gated_delta_rule(
            self.q[rows],
            self.k[rows],
            self.v[rows],
            self.g[rows],
            self.beta[rows],
            state,
            starts,
            slot_ids,
            scale=self.dk**-0.5,
        )

    def reference(self, lengths: list[int], slots: list[int]) -> tuple[np.ndarray, np.ndarray]:
        state = self.initial.copy()
        starts = np.concatenate([[0], np.cumsum(lengths)])
        b = self.backend
        out = gated_delta_rule_reference(
            host(b, self.q),
            host(b, self.k),
            host(b, self.v),
            host(b, self.g),
            host(b, self.beta),
            state,
            starts,
            np.asarray(slots),
            scale=self.dk**-0.5,
        )
        return out, state


def test_the_native_implementations_are_resolved(backend: CudaBackend) -> None:
    assert type(backend.ops(GatedDeltaOps)).__name__ == "CudaGatedDeltaOps"
    assert type(backend.ops(Mamba2Ops)).__name__ == "CudaMamba2Ops"


def test_gated_delta_rule_in_pieces_gives_the_bits_of_one_call(backend: CudaBackend) -> None:
    """Recurrent form: prefill chunks crossing 64-token boundaries, then decode steps: the outputs and the final
    state are those of one call over the 200 tokens, bit for bit (state carried across calls in fp32)."""
    delta = Delta(backend, 200, seed=5)
    whole_state, pieces_state = delta.state(), delta.state()
    with mode(backend, "recurrent"):
        whole = host(backend, delta.run(whole_state, slice(None), [200], [1]))
        parts = [host(backend, delta.run(pieces_state, slice(a, b), [b - a], [1])) for a, b in PIECES]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    np.testing.assert_array_equal(host(backend, pieces_state), host(backend, whole_state))


def test_chunked_form_in_pieces_carries_the_state(backend: CudaBackend) -> None:
    """Chunked form: the same pieces (65 and 67 tokens chunked, the others one token at a time) give the values
    of one call, the state handed between the two forms in fp32."""
    delta = Delta(backend, 200, seed=5)
    whole_state, pieces_state = delta.state(), delta.state()
    with mode(backend, "chunked"):
        whole = host(backend, delta.run(whole_state, slice(None), [200], [1]))
        parts = [host(backend, delta.run(pieces_state, slice(a, b), [b - a], [1])) for a, b in PIECES]
    close(np.concatenate(parts), whole, "pieces against one call")
    close(host(backend, pieces_state), host(backend, whole_state), "state", rel=CHUNKED_STATE_TOLERANCE)


@pytest.mark.parametrize("form", MODES)
def test_gated_delta_rule_rows_do_not_depend_on_the_batch(backend: CudaBackend, form: str) -> None:
    """A sequence's outputs and state are the same bits alone and in a varlen batch with others, in both forms
    (a chunked sequence's chunks start at its first token of the call, whatever else the batch holds)."""
    lengths, slots = [70, 1, 0, 129], [3, 0, 1, 2]
    delta = Delta(backend, sum(lengths), seed=9)
    batched_state, alone_state = delta.state(), delta.state()
    with mode(backend, form):
        batched = host(backend, delta.run(batched_state, slice(None), lengths, slots))
        alone = host(backend, delta.run(alone_state, slice(71, 200), [129], [2]))
    np.testing.assert_array_equal(batched[71:], alone)
    np.testing.assert_array_equal(host(backend, batched_state)[2], host(backend, alone_state)[2])
    want_out, want_state = delta.reference(lengths, slots)
    close(batched, want_out, "varlen batch output")
    tolerance = CHUNKED_STATE_TOLERANCE if form == "chunked" else 1e-3
    close(host(backend, batched_state), want_state, "varlen batch state", rel=tolerance)


@pytest.mark.parametrize("dims", [(16, 16), (32, 40), (64, 48), (128, 128)], ids=lambda d: f"dk{d[0]}-dv{d[1]}")
def test_chunked_form_at_every_key_width(backend: CudaBackend, dims: tuple[int, int]) -> None:
    """Each chunked kernel (key heads of 16, 32, 64 and 128; value heads not a multiple of the block's 32
    columns) against the reference over 200 tokens and 3 value heads per key head."""
    delta = Delta(backend, 200, seed=11, key_heads=1, value_heads=3, dims=dims)
    assert delta.chunked() is not None
    state = delta.state()
    out = host(backend, delta.run(state, slice(None), [200], [0]))
    want_out, want_state = delta.reference([200], [0])
    close(out, want_out, f"output, {dims}")
    close(host(backend, state)[0], want_state[0], f"state, {dims}", rel=CHUNKED_STATE_TOLERANCE)
    np.testing.assert_array_equal(host(backend, state)[1:], delta.initial[1:])


@pytest.mark.parametrize("dv", [16, 40, 128], ids=lambda d: f"dv{d}")
@pytest.mark.parametrize("lengths", [[1, 1, 1], [5, 1, 30]], ids=["decode", "prefill"])
def test_rule_with_its_norm_gives_the_bits_of_the_two_ops(backend: CudaBackend, dv: int, lengths: list[int]) -> None:
    """``gated_delta_rule_with_gates(norm=...)`` norms inside the recurrent kernel (the head's 1, 2 or 4 blocks in a
    thread-block cluster): the bits of the rule and then ``rms_norm_silu_gate``, and the same state."""
    assert normed_kernel(backend, dv) is not None
    tokens, heads = sum(lengths), 4
    delta = Delta(backend, tokens, seed=dv, dims=(128, dv))
    rng = np.random.default_rng(dv)
    projection = backend.from_numpy(rng.standard_normal((tokens, 8 + heads * dv + 2 * heads), dtype=np.float32))
    z = projection[:, 8 : 8 + heads * dv].reshape(tokens, heads, dv)
    a, b = projection[:, 8 + heads * dv : 8 + heads * dv + heads], projection[:, 8 + heads * dv + heads :]
    a_log = backend.from_numpy((0.5 * rng.standard_normal(heads)).astype(np.float32), dtype=F32)
    dt_bias = backend.from_numpy(rng.standard_normal(heads).astype(np.float32), dtype=F32)
    weight = backend.from_numpy(1 + 0.1 * rng.standard_normal(dv, dtype=np.float32), weight=True)
    ops = backend.ops(GatedDeltaOps)
    starts, slots = layout(backend, lengths, [3, 0, 2])
    fused_state, plain_state = delta.state(), delta.state()
    args = (delta.q, delta.k, delta.v, a, b, a_log, dt_bias)
    norm = OutputNorm(z, weight, 1e-6)
    fused = ops.gated_delta_rule_with_gates(*args, fused_state, starts, slots, scale=0.1, norm=norm)
    core = ops.gated_delta_rule_with_gates(*args, plain_state, starts, slots, scale=0.1)
    np.testing.assert_array_equal(host(backend, fused), host(backend, ops.rms_norm_silu_gate(core, z, weight, 1e-6)))
    np.testing.assert_array_equal(host(backend, fused_state), host(backend, plain_state))


# ---- Mamba-2 scan ----------------------------------------------------------------------------------
class Scan:
    """Inputs of one Mamba-2 mixer at Nemotron-H's head sizes (P = 64, N = 128, 2 groups), as strided
    views of one projection, with float32 per-head parameters and a nonzero state of 4 slots."""

    def __init__(
        self,
        backend: CudaBackend,
        tokens: int,
        seed: int,
        heads: int = 4,
        groups: int = 2,
        dims: tuple[int, int] = (64, 128),
    ) -> None:
        rng = np.random.default_rng(seed)
        self.backend, (p, n) = backend, dims
        inner, group_width = heads * p, groups * n
        width = -(-(inner + 2 * group_width + heads) // 8) * 8 + 8  # rows 16-byte aligned, as a model's projections
        wide = backend.from_numpy(rng.standard_normal((tokens, width), dtype=np.float32))
        self.x = wide[:, :inner].reshape(tokens, heads, p)
        self.B = wide[:, inner : inner + group_width].reshape(tokens, groups, n)
        self.C = wide[:, inner + group_width : inner + 2 * group_width].reshape(tokens, groups, n)
        self.dt = wide[:, inner + 2 * group_width : inner + 2 * group_width + heads]
        self.A = backend.from_numpy(-np.exp(rng.standard_normal(heads) * 0.5 - 0.5).astype(np.float32), dtype=F32)
        self.D = backend.from_numpy(rng.standard_normal(heads).astype(np.float32), dtype=F32)
        self.dt_bias = backend.from_numpy((rng.standard_normal(heads) * 0.5).astype(np.float32), dtype=F32)
        self.initial = (rng.standard_normal((4, heads, p, n)) * 0.3).astype(np.float32)

    def state(self) -> Any:
        return self.backend.from_numpy(self.initial.copy(), dtype=F32)

    def chunked(self) -> object:
        """The chunked kernel a call over these inputs takes in the current mode (None: the recurrent form)."""
        return chunked_kernel(self.backend, "mamba2", (self.x, self.B, self.C), self.B.shape[2], self.x.shape[2], 1)

    def run(self, state: Any, rows: slice, lengths: list[int], slots: list[int]) -> Any:
        starts, slot_ids = layout(self.backend, lengths, slots)
        return self.backend.ops(Mamba2Ops).mamba2_scan(
            self.x[rows],
            self.dt[rows],
            self.A,
            self.B[rows],
            self.C[rows],
            self.D,
            self.dt_bias,
            state,
            starts,
            slot_ids,
            128,
        )

    def decode(self, state: Any, rows: slice, slots: list[int]) -> Any:
        slot_ids = self.backend.from_numpy(np.asarray(slots, dtype=np.int32))
        return self.backend.ops(Mamba2Ops).mamba2_decode(
            self.x[rows], self.dt[rows], self.A, self.B[rows], self.C[rows], self.D, self.dt_bias, state, slot_ids
        )

    def reference(self, lengths: list[int], slots: list[int]) -> tuple[np.ndarray, np.ndarray]:
        state = self.initial.copy()
        b = self.backend
        out = mamba2_scan_reference(
            host(b, self.x),
            host(b, self.dt),
            host(b, self.A),
            host(b, self.B),
            host(b, self.C),
            host(b, self.D),
            host(b, self.dt_bias),
            state,
            np.concatenate([[0], np.cumsum(lengths)]),
            np.asarray(slots),
            64,
            0.0,
            float("inf"),
        )
        return out, state


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize(
    ("layer", "form"),
    [(Delta, "recurrent"), (Delta, "chunked"), (Scan, "recurrent"), (Scan, "chunked")],
    ids=["gated_delta_rule", "gated_delta_chunked", "mamba2_scan", "mamba2_chunked"],
)
def test_matches_the_chunked_reference(backend: CudaBackend, layer: type, form: str, length: int) -> None:
    """The kernels against the references' chunked forms (the delta rule's 64-token UT form, the SSD scan over
    64-token chunks), from a nonzero state; other slots stay bit for bit."""
    inputs = layer(backend, length, seed=length)
    state = inputs.state()
    with mode(backend, form):
        assert (inputs.chunked() is not None) == (form == "chunked" and length >= 64)
        out = inputs.run(state, slice(None), [length], [2])
    want_out, want_state = inputs.reference([length], [2])
    tolerance = CHUNKED_STATE_TOLERANCE if form == "chunked" and length >= 64 else 1e-3
    close(host(backend, out), want_out, f"output, {length} tokens")
    close(host(backend, state)[2], want_state[2], f"state, {length} tokens", rel=tolerance)
    np.testing.assert_array_equal(host(backend, state)[[0, 1, 3]], inputs.initial[[0, 1, 3]])


def test_mamba2_scan_in_pieces_and_decode_steps_give_the_bits_of_one_call(backend: CudaBackend) -> None:
    """Recurrent form (the batch-invariant mode): pieces, decode steps and one call give the same bits."""
    scan = Scan(backend, 200, seed=3)
    whole_state, pieces_state, steps_state = scan.state(), scan.state(), scan.state()
    with mode(backend, "recurrent"):
        whole = host(backend, scan.run(whole_state, slice(None), [200], [3]))
        pieces = [host(backend, scan.run(pieces_state, slice(a, b), [b - a], [3])) for a, b in PIECES]
    steps = [host(backend, scan.decode(steps_state, slice(t, t + 1), [3])) for t in range(200)]
    np.testing.assert_array_equal(np.concatenate(pieces), whole)
    np.testing.assert_array_equal(np.concatenate(steps), whole)
    np.testing.assert_array_equal(host(backend, pieces_state), host(backend, whole_state))
    np.testing.assert_array_equal(host(backend, steps_state), host(backend, whole_state))


@pytest.mark.parametrize("dims", [(64, 16), (40, 64), (64, 128)], ids=lambda d: f"p{d[0]}-n{d[1]}")
def test_mamba2_chunked_form(backend: CudaBackend, dims: tuple[int, int]) -> None:
    """The chunked SSD kernels (state sizes of 16, 64 and 128; head dims not a multiple of the block's 32) against
    the reference, whole and fed in pieces (the state handed between the two forms), and alone as in a batch."""
    scan = Scan(backend, 200, seed=13, dims=dims)
    whole_state, pieces_state = scan.state(), scan.state()
    with mode(backend, "chunked"):
        assert scan.chunked() is not None
        whole = host(backend, scan.run(whole_state, slice(None), [200], [3]))
        pieces = [host(backend, scan.run(pieces_state, slice(a, b), [b - a], [3])) for a, b in PIECES]
        batched_state = scan.state()
        batched = host(backend, scan.run(batched_state, slice(None), [1, 70, 129], [0, 1, 2]))
        alone_state = scan.state()
        alone = host(backend, scan.run(alone_state, slice(71, 200), [129], [2]))
    want_out, want_state = scan.reference([200], [3])
    close(whole, want_out, f"output, {dims}")
    close(host(backend, whole_state)[3], want_state[3], f"state, {dims}", rel=CHUNKED_STATE_TOLERANCE)
    close(np.concatenate(pieces), whole, "pieces against one call")
    close(host(backend, pieces_state), host(backend, whole_state), "state", rel=CHUNKED_STATE_TOLERANCE)
    np.testing.assert_array_equal(batched[71:], alone)
    np.testing.assert_array_equal(host(backend, batched_state)[2], host(backend, alone_state)[2])


# ---- causal conv1d -----------------------------------------------------------------------------------
def test_causal_conv1d_paths_agree_bit_for_bit(backend: CudaBackend) -> None:
    """Decode-sized batches (a thread per sequence) and prefill-sized ones (a thread per row) give the same
    bits, whole or in pieces, and match the reference; the state ends as the reference leaves it."""
    rng = np.random.default_rng(4)
    tokens, channels, taps = 200, 1100, 4
    x = backend.from_numpy(rng.standard_normal((tokens, channels + 64), dtype=np.float32))[:, 32 : 32 + channels]
    weight = backend.from_numpy(rng.standard_normal((channels, taps), dtype=np.float32) * 0.5, weight=True)
    bias = backend.from_numpy(rng.standard_normal(channels, dtype=np.float32), weight=True)
    initial = backend.to_numpy(backend.from_numpy(rng.standard_normal((3, channels, taps - 1), dtype=np.float32)))
    ops = backend.ops(Mamba2Ops)

    def run(pieces: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        state = backend.from_numpy(initial.copy(), dtype=initial.dtype)
        outs = []
        for a, b in pieces:
            starts, slots = layout(backend, [b - a], [2])
            outs.append(host(backend, ops.causal_conv1d(x[a:b], weight, bias, state, starts, slots)))
        return np.concatenate(outs), host(backend, state)

    whole, whole_state = run([(0, tokens)])
    stepped, stepped_state = run([(t, t + 1) for t in range(tokens)])
    pieces, pieces_state = run(PIECES)
    for got, got_state in ((stepped, stepped_state), (pieces, pieces_state)):
        np.testing.assert_array_equal(got, whole)
        np.testing.assert_array_equal(got_state, whole_state)
    want_state = initial.astype(np.float32)
    want = causal_conv1d_reference(
        host(backend, x), host(backend, weight), host(backend, bias), want_state, np.array([0, tokens]), np.array([2])
    )
    close(whole, want, "causal_conv1d")
    np.testing.assert_array_equal(whole_state, want_state)


# ---- padding slots -------------------------------------------------------------------------------------
def test_padding_slots_read_and_write_no_state(backend: CudaBackend) -> None:
    """Slot -1 (a captured decode graph's padding rows): the row is computed from a zero state, and no state
    row changes; the real sequence beside it gets its usual result."""
    delta = Delta(backend, 2, seed=1)
    state = delta.state()
    out = host(backend, delta.run(state, slice(None), [1, 1], [-1, 3]))
    np.testing.assert_array_equal(host(backend, state)[:3], delta.initial[:3])
    zero = backend.from_numpy(np.zeros_like(delta.initial), dtype=F32)
    np.testing.assert_array_equal(out[0], host(backend, delta.run(zero, slice(0, 1), [1], [0]))[0])
    reference = delta.state()
    np.testing.assert_array_equal(out[1], host(backend, delta.run(reference, slice(1, 2), [1], [3]))[0])

    scan = Scan(backend, 2, seed=2)
    state = scan.state()
    y = host(backend, scan.decode(state, slice(None), [-1, 0]))
    np.testing.assert_array_equal(host(backend, state)[1:], scan.initial[1:])
    zero = backend.from_numpy(np.zeros_like(scan.initial), dtype=F32)
    np.testing.assert_array_equal(y[0], host(backend, scan.decode(zero, slice(0, 1), [2]))[0])

    conv_state = backend.from_numpy(np.ones((2, 8, 3), dtype=np.float32))
    x = backend.from_numpy(np.arange(16, dtype=np.float32).reshape(2, 8) / 8)
    weight = backend.from_numpy(np.ones((8, 4), dtype=np.float32), weight=True)
    starts, slots = layout(backend, [1, 1], [-1, -1])
    got = host(backend, backend.ops(Mamba2Ops).causal_conv1d(x, weight, None, conv_state, starts, slots))
    np.testing.assert_array_equal(host(backend, conv_state), 1.0)
    close(got, host(backend, x) / (1 + np.exp(-host(backend, x))), "conv rows of padding slots")


# ---- gated norms ----------------------------------------------------------------------------------------
def test_gated_norms_at_the_real_sizes(backend: CudaBackend) -> None:
    """rms_norm_silu_gate over [T, 32, 128] with the gate a strided view; gated_rms_norm over 8 groups of 512."""
    rng = np.random.default_rng(6)
    core = backend.from_numpy(rng.standard_normal((5, 32, 128), dtype=np.float32))
    z = backend.from_numpy(rng.standard_normal((5, 32 * 128 + 40), dtype=np.float32))[:, 8 : 8 + 32 * 128].reshape(
        5, 32, 128
    )
    w = backend.from_numpy(1 + 0.1 * rng.standard_normal(128, dtype=np.float32), weight=True)
    got = backend.ops(GatedDeltaOps).rms_norm_silu_gate(core, z, w, 1e-6)
    want = rms_norm_silu_gate_reference(host(backend, core), host(backend, z), host(backend, w), 1e-6)
    close(host(backend, got), want, "rms_norm_silu_gate")
    y = backend.from_numpy(rng.standard_normal((5, 4096), dtype=np.float32))
    gate = backend.from_numpy(rng.standard_normal((5, 4096 + 24), dtype=np.float32))[:, 24:]
    w = backend.from_numpy(1 + 0.1 * rng.standard_normal(4096, dtype=np.float32), weight=True)
    got = backend.ops(Mamba2Ops).gated_rms_norm(y, gate, w, 1e-5, 512)
    want = gated_rms_norm_reference(host(backend, y), host(backend, gate), host(backend, w), 1e-5, 512)
    close(host(backend, got), want, "gated_rms_norm")
