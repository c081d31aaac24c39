"""Backend conformance: the gated_delta ops (gdn_gates, gated_delta_rule, gated_delta_rule_with_gates,
rms_norm_silu_gate) against float64 oracles, and the agreement of the delta rule's chunked and recurrent
reference forms.

Fixtures, tolerances and the seed handling (``ATLAS_CONFORMANCE_SEED``) are in
``atlas_core.testing.conformance``.
"""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.backends.base import Array
from atlas_core.backends.ops.checkpoints import CHECKPOINTED_TOKENS
from atlas_core.backends.ops.gated_delta import (
    GatedDeltaOps,
    OutputNorm,
    gated_delta_chunked,
    gated_delta_recurrent,
)
from atlas_core.testing.conformance import Case, backend, case, verify_checkpoints  # noqa: F401 (fixtures)


# ---- float64 oracles -----------------------------------------------------------------------------
def oracle_gdn_gates(
    a: np.ndarray, b: np.ndarray, a_log: np.ndarray, dt_bias: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    x = a + dt_bias
    softplus = np.where(x > 30, x, np.log1p(np.exp(np.minimum(x, 30))))
    return -np.exp(a_log) * softplus, 1.0 / (1.0 + np.exp(-b))


def oracle_delta_rule(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    state: np.ndarray,
    starts: list[int],
    slots: list[int],
    scale: float,
    checkpoints: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Token by token, head by head, straight from the op's contract; returns (out, new state), the state after
    token t also in row ``checkpoints[t]`` where that is not -1."""
    state = state.copy()
    value_heads, key_heads = v.shape[1], q.shape[1]
    out = np.zeros(v.shape)
    for b, slot in enumerate(slots):
        for t in range(starts[b], starts[b + 1]):
            for h in range(value_heads):
                kh = h // (value_heads // key_heads)
                qv = q[t, kh] / np.sqrt(np.sum(q[t, kh] ** 2) + 1e-6) * scale
                kv = k[t, kh] / np.sqrt(np.sum(k[t, kh] ** 2) + 1e-6)
                s = state[slot, h] * np.exp(g[t, h])
                delta = beta[t, h] * (v[t, h] - kv @ s)
                s = s + np.outer(kv, delta)
                state[slot, h] = s
                out[t, h] = qv @ s
            if checkpoints is not None and checkpoints[t] >= 0:
                state[checkpoints[t]] = state[slot]
    return out, state


def oracle_rms_norm_silu_gate(x: np.ndarray, gate: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    normed = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight
    return normed * gate / (1.0 + np.exp(-gate))


# ---- ops -----------------------------------------------------------------------------------------
def test_gdn_gates(case: Case) -> None:
    tokens, heads = 9, 6
    a_dev, a = case.upload(case.normal(tokens, heads, scale=3.0))
    b_dev, b = case.upload(case.normal(tokens, heads, scale=3.0))
    a_log_dev, a_log = case.upload(case.normal(heads), weight=True)
    dt_dev, dt = case.upload(case.normal(heads), weight=True)
    with case.unchanged("gdn_gates", a=a_dev, b=b_dev):
        g, beta = case.backend.ops(GatedDeltaOps).gdn_gates(a_dev, b_dev, a_log_dev, dt_dev)
    want_g, want_beta = oracle_gdn_gates(a, b, a_log, dt)
    case.assert_close(g, want_g, "gdn_gates g", dtype=np.float32)
    case.assert_close(beta, want_beta, "gdn_gates beta", dtype=np.float32)


def delta_inputs(
    case: Case,
    lengths: list[int],
    key_heads: int = 2,
    value_heads: int = 4,
    dk: int = 8,
    dv: int = 6,
    spare_slots: int = 2,
):
    """Random q/k/v/g/beta for sequences of ``lengths`` tokens, and a state with nonzero rows (``spare_slots``
    more rows than sequences)."""
    tokens = sum(lengths)
    num_slots = len(lengths) + spare_slots
    host = {
        "q": case.normal(tokens, key_heads, dk),
        "k": case.normal(tokens, key_heads, dk),
        "v": case.normal(tokens, value_heads, dv),
    }
    dev = {name: case.upload(x) for name, x in host.items()}
    g = -case.rng.uniform(0.0, 1.5, size=(tokens, value_heads)).astype(np.float32)
    beta = case.rng.uniform(0.0, 1.0, size=(tokens, value_heads)).astype(np.float32)
    f32 = np.dtype(np.float32)
    g_dev, beta_dev = (case.backend.from_numpy(x, dtype=f32) for x in (g, beta))
    state = (case.rng.standard_normal((num_slots, value_heads, dk, dv)) * 0.5).astype(np.float32)
    slots = case.rng.permutation(num_slots)[: len(lengths)].tolist()
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return dev, g_dev, beta_dev, g.astype(np.float64), beta.astype(np.float64), state, slots, starts


@pytest.mark.parametrize(
    "lengths", [[1], [1, 1, 1], [5, 1, 70], [150, 3]], ids=["decode", "decode3", "mixed", "chunks"]
)
def test_gated_delta_rule(case: Case, lengths: list[int]) -> None:
    """Every sequence continues from its own (nonzero) state row; other rows stay as they were."""
    dev, g_dev, beta_dev, g, beta, state, slots, starts = delta_inputs(case, lengths)
    state_dev = case.backend.from_numpy(state.copy(), dtype=np.dtype(np.float32))  # the op updates it in place
    starts_dev, slots_dev = case.backend.from_numpy(starts), case.backend.from_numpy(np.asarray(slots, dtype=np.int32))
    scale = 8**-0.5
    (q_dev, q), (k_dev, k), (v_dev, v) = dev["q"], dev["k"], dev["v"]
    with case.unchanged("gated_delta_rule", q=q_dev, k=k_dev, v=v_dev):
        out = case.backend.ops(GatedDeltaOps).gated_delta_rule(
            q_dev, k_dev, v_dev, g_dev, beta_dev, state_dev, starts_dev, slots_dev, scale=scale
        )
    want_out, want_state = oracle_delta_rule(q, k, v, g, beta, state.astype(np.float64), starts.tolist(), slots, scale)
    case.assert_close(out, want_out, "gated_delta_rule output")
    case.assert_close(state_dev, want_state, "gated_delta_rule state (in place)", dtype=np.float32)


@pytest.mark.parametrize("normed", [False, True], ids=["plain", "normed"])
@pytest.mark.parametrize("lengths", [[1, 1, 1], [70, 2]], ids=["decode", "prefill"])
def test_gated_delta_rule_with_gates(case: Case, lengths: list[int], normed: bool) -> None:
    """The fused op: the rule with the gates of `gdn_gates` over ``a`` and ``b``, passed as column slices of one
    projection (as the layer passes them), and with ``normed`` its output through `rms_norm_silu_gate`; 16-wide
    key heads, which the cuda backend's chunked kernels take."""
    dev, *_, state, slots, starts = delta_inputs(case, lengths, dk=16, dv=8)
    tokens, heads = sum(lengths), 4
    projection_dev, projection = case.upload(case.normal(tokens, 2 * heads + 3, scale=2.0))
    a_log_dev, a_log = case.upload(case.normal(heads, scale=0.5), weight=True)
    dt_dev, dt = case.upload(case.normal(heads), weight=True)
    starts_dev, slots_dev = case.backend.from_numpy(starts), case.backend.from_numpy(np.asarray(slots, dtype=np.int32))
    (q_dev, q), (k_dev, k), (v_dev, v) = dev["q"], dev["k"], dev["v"]
    a_dev, b_dev = projection_dev[:, 1 : 1 + heads], projection_dev[:, 1 + heads : 1 + 2 * heads]
    z_dev, z = case.upload(case.normal(tokens, heads, 8, scale=2.0))
    w_dev, w = case.upload(1.0 + case.normal(8, scale=0.2), weight=True)

    def run(norm: OutputNorm | None) -> tuple[Array, Array]:
        state_dev = case.backend.from_numpy(state.copy(), dtype=np.dtype(np.float32))
        with case.unchanged("gated_delta_rule_with_gates", q=q_dev, k=k_dev, v=v_dev, a=a_dev, b=b_dev, z=z_dev):
            out = case.backend.ops(GatedDeltaOps).gated_delta_rule_with_gates(
                *(q_dev, k_dev, v_dev, a_dev, b_dev, a_log_dev, dt_dev, state_dev, starts_dev, slots_dev),
                scale=0.25,
                norm=norm,
            )
        return out, state_dev

    out, state_dev = run(OutputNorm(z_dev, w_dev, 1e-6) if normed else None)
    g, beta = oracle_gdn_gates(projection[:, 1 : 1 + heads], projection[:, 1 + heads : 1 + 2 * heads], a_log, dt)
    want_out, want_state = oracle_delta_rule(q, k, v, g, beta, state.astype(np.float64), starts.tolist(), slots, 0.25)
    if normed:  # the norm of the backend's own rule output (a norm over 8 dims magnifies the rule's rounding)
        want_out = oracle_rms_norm_silu_gate(case.raw(run(None)[0]).astype(np.float64), z, w, 1e-6)
    case.assert_close(out, want_out, "gated_delta_rule_with_gates output")
    case.assert_close(state_dev, want_state, "gated_delta_rule_with_gates state (in place)", dtype=np.float32)


def test_gated_delta_rule_writes_checkpoints(case: Case) -> None:
    """A verify step: sequences of 3 and 4 tokens (a decode token and its drafts) leave their state after each
    token but the last in checkpoint rows, beside a decode token and a 70-token prefill without checkpoints;
    the checkpoint rows hold the oracle's states, every row outside the step stays as it was."""
    lengths = [3, 1, 70, 4]
    dev, g_dev, beta_dev, g, beta, state, slots, starts = delta_inputs(case, lengths, dk=16, dv=8, spare_slots=6)
    free = [s for s in range(len(state)) if s not in slots]
    checkpoints = verify_checkpoints(lengths, [True, False, False, True], free)
    state_dev = case.backend.from_numpy(state.copy(), dtype=np.dtype(np.float32))
    (q_dev, q), (k_dev, k), (v_dev, v) = dev["q"], dev["k"], dev["v"]
    out = case.backend.ops(GatedDeltaOps).gated_delta_rule(
        *(q_dev, k_dev, v_dev, g_dev, beta_dev, state_dev),
        case.backend.from_numpy(starts),
        case.backend.from_numpy(np.asarray(slots, dtype=np.int32)),
        scale=0.25,
        checkpoints=case.backend.from_numpy(checkpoints),
    )
    oracle = oracle_delta_rule(q, k, v, g, beta, state.astype(np.float64), starts.tolist(), slots, 0.25, checkpoints)
    case.assert_close(out, oracle[0], "gated_delta_rule output with checkpoints")
    written = [*slots, *checkpoints[checkpoints >= 0].tolist()]
    assert len(written) == 9
    case.assert_close(state_dev[written], oracle[1][written], "gated_delta_rule checkpoint rows", dtype=np.float32)
    untouched = [s for s in range(len(state)) if s not in written]
    case.assert_equal(case.host(state_dev)[untouched], state[untouched], "gated_delta_rule rows outside the step")


def test_checkpoints_refused_in_long_sequences(case: Case) -> None:
    """A sequence with checkpoints has fewer than `CHECKPOINTED_TOKENS` tokens in a call (backends take the chunked
    form for longer ones); a longer one is refused with the rule in the message."""
    lengths = [2, CHECKPOINTED_TOKENS]
    dev, g_dev, beta_dev, *_, state, slots, starts = delta_inputs(case, lengths, spare_slots=CHECKPOINTED_TOKENS)
    free = [s for s in range(len(state)) if s not in slots]
    with pytest.raises(ValueError, match=f"fewer than {CHECKPOINTED_TOKENS} tokens"):
        case.backend.ops(GatedDeltaOps).gated_delta_rule(
            *(dev["q"][0], dev["k"][0], dev["v"][0], g_dev, beta_dev),
            case.backend.from_numpy(state, dtype=np.dtype(np.float32)),
            case.backend.from_numpy(starts),
            case.backend.from_numpy(np.asarray(slots, dtype=np.int32)),
            scale=1.0,
            checkpoints=case.backend.from_numpy(verify_checkpoints(lengths, [False, True], free)),
        )


def test_gated_delta_rule_continues_across_calls(case: Case) -> None:
    """A sequence fed in pieces (prefill chunks, then decode steps) gives the outputs of one call."""
    length = 90
    dev, g_dev, beta_dev, *_, state, slots, _ = delta_inputs(case, [length])
    (q_dev, _), (k_dev, _), (v_dev, _) = dev["q"], dev["k"], dev["v"]
    slot = case.backend.from_numpy(np.asarray(slots[:1], dtype=np.int32))
    whole_state = case.backend.from_numpy(state.copy(), dtype=np.dtype(np.float32))
    whole = case.raw(
        case.backend.ops(GatedDeltaOps).gated_delta_rule(
            q_dev,
            k_dev,
            v_dev,
            g_dev,
            beta_dev,
            whole_state,
            case.backend.from_numpy(np.asarray([0, length], dtype=np.int32)),
            slot,
            scale=0.3,
        )
    )
    pieces_state = case.backend.from_numpy(state.copy(), dtype=np.dtype(np.float32))
    parts = []
    for start, end in [(0, 3), (3, 70), (70, 71), (71, 89), (89, 90)]:
        span = slice(start, end)
        parts.append(
            case.raw(
                case.backend.ops(GatedDeltaOps).gated_delta_rule(
                    q_dev[span],
                    k_dev[span],
                    v_dev[span],
                    g_dev[span],
                    beta_dev[span],
                    pieces_state,
                    case.backend.from_numpy(np.asarray([0, end - start], dtype=np.int32)),
                    slot,
                    scale=0.3,
                )
            )
        )
    case.assert_values(np.concatenate(parts).astype(np.float64), whole.astype(np.float64), "pieces vs one call")
    case.assert_values(case.host(pieces_state), case.host(whole_state), "final state, pieces vs one call")


def test_gated_delta_rule_rejects_shared_slots(case: Case) -> None:
    dev, g_dev, beta_dev, *_, state, _, starts = delta_inputs(case, [2, 2])
    with pytest.raises(ValueError, match="share a state slot"):
        case.backend.ops(GatedDeltaOps).gated_delta_rule(
            dev["q"][0],
            dev["k"][0],
            dev["v"][0],
            g_dev,
            beta_dev,
            case.backend.from_numpy(state),
            case.backend.from_numpy(starts),
            case.backend.from_numpy(np.asarray([1, 1], dtype=np.int32)),
            scale=1.0,
        )


@pytest.mark.parametrize("shape", [(5, 3, 8), (1, 16)])
def test_rms_norm_silu_gate(case: Case, shape: tuple[int, ...]) -> None:
    x_dev, x = case.upload(case.normal(*shape, scale=2.0))
    gate_dev, gate = case.upload(case.normal(*shape, scale=3.0))
    w_dev, w = case.upload(1.0 + case.normal(shape[-1], scale=0.2), weight=True)
    with case.unchanged("rms_norm_silu_gate", x=x_dev, gate=gate_dev):
        got = case.backend.ops(GatedDeltaOps).rms_norm_silu_gate(x_dev, gate_dev, w_dev, 1e-6)
    case.assert_close(got, oracle_rms_norm_silu_gate(x, gate, w, 1e-6), "rms_norm_silu_gate")


# ---- the two reference forms of the delta rule ---------------------------------------------------
@pytest.mark.parametrize(("length", "chunk_size"), [(1, 64), (63, 64), (64, 64), (200, 64), (37, 8), (50, 1)])
def test_chunked_form_equals_recurrent_form(length: int, chunk_size: int) -> None:
    """The chunked (prefill) and recurrent (decode) references agree on random inputs, from a nonzero
    state, whatever the chunk size and however the length falls on chunk boundaries."""
    rng = np.random.default_rng(length * 1000 + chunk_size)
    heads, dk, dv = 3, 8, 5
    k = rng.standard_normal((length, heads, dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    args = [
        (rng.standard_normal((length, heads, dk)) * dk**-0.5).astype(np.float32),
        k.astype(np.float32),
        rng.standard_normal((length, heads, dv)).astype(np.float32),
        -rng.uniform(0.0, 2.0, (length, heads)).astype(np.float32),
        rng.uniform(0.0, 1.0, (length, heads)).astype(np.float32),
        rng.standard_normal((heads, dk, dv)).astype(np.float32),
    ]
    out_recurrent, state_recurrent = gated_delta_recurrent(*args)
    out_chunked, state_chunked = gated_delta_chunked(*args, chunk_size=chunk_size)
    np.testing.assert_allclose(out_chunked, out_recurrent, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(state_chunked, state_recurrent, rtol=1e-4, atol=2e-5)
