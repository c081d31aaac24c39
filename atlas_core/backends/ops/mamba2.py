"""Ops of the mamba2 group with a host fallback (see `atlas_core.backends.ops`).

Mamba-2 (state-space duality, "SSD") layers keep two pieces of state per sequence, one row per state
slot (`atlas_core.model.recurrent_state.RecurrentState`): the last ``K - 1`` inputs of a short causal
depthwise convolution, and the SSM state ``[heads, head_dim, state_size]``. The ops read and update
the rows named by ``state_slots`` in place, so a prefill may arrive in chunks and decode continues
where the prefill stopped. A slot is all zeros before a sequence's first token.

Notation: T tokens in a varlen batch, B sequences (``query_start_loc [B+1]``, ``state_slots [B]``,
int32, every slot >= 0 and distinct), S slots, C channels, K kernel width, Hm SSM heads of P values,
G groups of state size N (head ``h`` reads group ``h // (Hm / G)``).

The scan is defined by its recurrence (for one sequence, token after token)::

    delta_t = clip(softplus(dt_t + dt_bias), dt_min, dt_max)            # [Hm]
    state   = exp(delta_t * A) * state + delta_t * x_t ⊗ B_t            # [Hm, P, N]
    y_t     = state · C_t + D * x_t                                     # [Hm, P]

`mamba2_scan` evaluates it in the chunked (SSD) form: within a chunk as one masked matrix product,
across chunks by carrying the state. `mamba2_decode` takes one step for each of B sequences. Both
give the recurrence's values to rounding, whatever the chunk size. `causal_conv1d` is the short
convolution before the scan, `gated_rms_norm` the gated group norm after it, and `relu_squared` the
activation of the Mamba-2 hybrids' (Nemotron-H) MLPs. ``docs/ops.md`` has the contracts in a table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from atlas_core.backends.ops import OpGroup, host_state, on_host
from atlas_core.backends.ops.checkpoints import check_checkpoints, checkpoint_segments

if TYPE_CHECKING:
    from atlas_core.backends.base import Array

F32 = np.float32


# ---- NumPy references (host arrays; fp32 math; the executable specification) --------------------
def _sequences(query_start_loc: np.ndarray, state_slots: np.ndarray) -> list[tuple[int, int, int]]:
    """``(first row, end row, slot)`` per sequence, after checking the slots."""
    starts = np.asarray(query_start_loc, dtype=np.int64)
    slots = np.asarray(state_slots, dtype=np.int64)
    if len(starts) != len(slots) + 1:
        raise ValueError(f"query_start_loc has {len(starts)} entries, expected len(state_slots) + 1 = {len(slots) + 1}")
    if (slots < 0).any():
        raise ValueError(f"every sequence of a Mamba-2 layer needs a state slot, got state_slots={slots.tolist()}")
    if len(set(slots.tolist())) != len(slots):
        raise ValueError(f"two sequences of one batch share a state slot: state_slots={slots.tolist()}")
    return [(int(starts[b]), int(starts[b + 1]), int(slots[b])) for b in range(len(slots))]


def _silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp overflow for x < -88 gives silu = -0, as it should
        return x / (F32(1) + np.exp(-x))


def causal_conv1d_reference(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None,
    conv_state: np.ndarray,
    query_start_loc: np.ndarray,
    state_slots: np.ndarray,
    checkpoints: np.ndarray | None = None,
) -> np.ndarray:
    """Depthwise causal convolution + SiLU over each sequence, continuing from and updating its state.

    ``x [T, C]``, ``weight [C, K]``, ``bias [C]`` or None, ``conv_state [S, C, K-1]`` (the previous
    K - 1 inputs of each slot, oldest first) -> ``[T, C]`` in ``x``'s dtype. For sequence b with rows
    ``r0:r1`` and slot s, ``w = [conv_state[s].T ; x[r0:r1]]`` (``K - 1 + L`` rows) and
    ``out[r0 + t] = silu(sum_k w[t + k] * weight[:, k] + bias)``; afterwards ``conv_state[s]`` holds
    the last K - 1 rows of ``w`` (in place), and row ``checkpoints[t]`` (`atlas_core.backends.ops.checkpoints`)
    the K - 1 rows of ``w`` that end with token t. Other slots are untouched.
    """
    kernel = weight.shape[1]
    if conv_state.shape[1:] != (weight.shape[0], kernel - 1) or x.shape[1] != weight.shape[0]:
        raise ValueError(
            f"causal_conv1d: x {x.shape}, weight {weight.shape} and conv_state {conv_state.shape} do not agree "
            "(expected x [T, C], weight [C, K], conv_state [S, C, K-1])"
        )
    check_checkpoints(checkpoints, x.shape[0], state_slots, conv_state.shape[0], query_start_loc)
    w = weight.astype(F32)
    out = np.empty(x.shape, dtype=x.dtype)
    for r0, r1, slot in _sequences(query_start_loc, state_slots):
        length = r1 - r0
        if length == 0:
            continue
        window = np.concatenate([conv_state[slot].T.astype(F32), x[r0:r1].astype(F32)])  # [K-1+L, C]
        acc = np.zeros((length, x.shape[1]), dtype=F32)
        for k in range(kernel):
            acc += window[k : k + length] * w[:, k]
        if bias is not None:
            acc += bias.astype(F32)
        out[r0:r1] = _silu(acc)
        for _, stop, checkpoint in checkpoint_segments(r0, r1, checkpoints):
            if checkpoint >= 0:
                conv_state[checkpoint] = window[stop - r0 : stop - r0 + kernel - 1].T
        conv_state[slot] = window[length:].T
    return out


def _discretise(dt: np.ndarray, dt_bias: np.ndarray, dt_min: float, dt_max: float) -> np.ndarray:
    """``clip(softplus(dt + dt_bias), dt_min, dt_max)`` in fp32."""
    return np.clip(np.logaddexp(F32(0), dt.astype(F32) + dt_bias.astype(F32)), dt_min, dt_max).astype(F32)


def _per_head(groups: np.ndarray, heads: int) -> np.ndarray:
    """``[..., G, N]`` -> ``[..., Hm, N]``: head h reads group h // (Hm / G)."""
    return np.repeat(groups.astype(F32), heads // groups.shape[-2], axis=-2)


def _ssd_chunks(
    x: np.ndarray,
    delta: np.ndarray,
    A: np.ndarray,
    B: np.ndarray,
    C: np.ndarray,
    state: np.ndarray,
    chunk_size: int,
) -> tuple[np.ndarray, np.ndarray]:
    """One sequence in the chunked form: ``x [L, Hm, P]``, ``delta [L, Hm]``, ``B``/``C [L, Hm, N]``,
    initial ``state [Hm, P, N]`` -> ``(y without the D skip [L, Hm, P], final state)``."""
    y = np.empty(x.shape, dtype=F32)
    for c0 in range(0, len(x), chunk_size):
        chunk = slice(c0, c0 + chunk_size)
        xs, ds, bs, cs = x[chunk], delta[chunk], B[chunk], C[chunk]
        length = len(xs)
        decay = np.cumsum(ds * A, axis=0)  # [l, Hm]: log of the decay from the chunk start to each token
        causal = np.tril(np.ones((length, length), dtype=bool))[:, :, None]
        gaps = np.where(causal, decay[:, None, :] - decay[None, :, :], -np.inf)  # [i, j, Hm], <= 0 where j <= i
        scores = np.einsum("ihn,jhn->ijh", cs, bs) * np.exp(gaps)
        y_within = np.einsum("ijh,jhp->ihp", scores, ds[:, :, None] * xs)
        y_carried = np.einsum("ihn,hpn->ihp", cs, state) * np.exp(decay)[:, :, None]
        y[c0 : c0 + length] = y_within + y_carried
        to_end = np.exp(decay[-1][None, :] - decay) * ds  # [l, Hm]
        state = state * np.exp(decay[-1])[:, None, None] + np.einsum("jh,jhp,jhn->hpn", to_end, xs, bs)
    return y, state


def mamba2_scan_reference(
    x: np.ndarray,
    dt: np.ndarray,
    A: np.ndarray,
    B: np.ndarray,
    C: np.ndarray,
    D: np.ndarray,
    dt_bias: np.ndarray,
    ssm_state: np.ndarray,
    query_start_loc: np.ndarray,
    state_slots: np.ndarray,
    chunk_size: int,
    dt_min: float,
    dt_max: float,
    checkpoints: np.ndarray | None = None,
) -> np.ndarray:
    """The selective scan over a varlen batch, chunked form (see the module docstring).

    ``x [T, Hm, P]``, ``dt [T, Hm]``, ``A``/``D``/``dt_bias [Hm]``, ``B``/``C [T, G, N]``,
    ``ssm_state [S, Hm, P, N]`` (float32, in place: each sequence starts from its slot's row and
    leaves its final state there, and the state after token t in row ``checkpoints[t]``,
    `atlas_core.backends.ops.checkpoints`) -> ``y [T, Hm, P]`` in ``x``'s dtype. ``chunk_size >= 1``.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    heads = x.shape[1]
    if heads % B.shape[1]:
        raise ValueError(f"mamba2_scan: {heads} heads are not a multiple of {B.shape[1]} groups")
    check_checkpoints(checkpoints, x.shape[0], state_slots, ssm_state.shape[0], query_start_loc)
    out = np.empty(x.shape, dtype=x.dtype)
    a, d = A.astype(F32), D.astype(F32)
    for r0, r1, slot in _sequences(query_start_loc, state_slots):
        for first, stop, checkpoint in checkpoint_segments(r0, r1, checkpoints):
            xs = x[first:stop].astype(F32)
            delta = _discretise(dt[first:stop], dt_bias, dt_min, dt_max)
            y, ssm_state[slot] = _ssd_chunks(
                xs,
                delta,
                a,
                _per_head(B[first:stop], heads),
                _per_head(C[first:stop], heads),
                ssm_state[slot].astype(F32),
                chunk_size,
            )
            out[first:stop] = y + d[:, None] * xs
            if checkpoint >= 0:
                ssm_state[checkpoint] = ssm_state[slot]
    return out


def mamba2_decode_reference(
    x: np.ndarray,
    dt: np.ndarray,
    A: np.ndarray,
    B: np.ndarray,
    C: np.ndarray,
    D: np.ndarray,
    dt_bias: np.ndarray,
    ssm_state: np.ndarray,
    state_slots: np.ndarray,
    dt_min: float,
    dt_max: float,
) -> np.ndarray:
    """One recurrence step for each of B sequences (row b is sequence b's next token).

    ``x [B, Hm, P]``, ``dt [B, Hm]``, ``B``/``C [B, G, N]``, the rest as in `mamba2_scan_reference`;
    updates ``ssm_state[state_slots]`` in place -> ``y [B, Hm, P]`` in ``x``'s dtype.
    """
    slots = np.asarray(state_slots, dtype=np.int64)
    _sequences(np.arange(len(slots) + 1), slots)
    heads = x.shape[1]
    xs = x.astype(F32)
    delta = _discretise(dt, dt_bias, dt_min, dt_max)  # [B, Hm]
    state = ssm_state[slots].astype(F32) * np.exp(delta * A.astype(F32))[:, :, None, None]
    state += (delta[:, :, None] * xs)[:, :, :, None] * _per_head(B, heads)[:, :, None, :]
    ssm_state[slots] = state
    y = np.einsum("bhpn,bhn->bhp", state, _per_head(C, heads)) + D.astype(F32)[:, None] * xs
    return y.astype(x.dtype)


def gated_rms_norm_reference(
    x: np.ndarray, gate: np.ndarray, weight: np.ndarray, eps: float, group_size: int
) -> np.ndarray:
    """Mamba-2's output norm: ``h = x * silu(gate)``, RMS-normalised over consecutive groups of
    ``group_size`` channels (eps inside the square root), times ``weight``.
    ``x``/``gate [T, I]``, ``weight [I]``, ``I`` a multiple of ``group_size`` -> ``[T, I]`` in ``x``'s dtype."""
    tokens, width = x.shape
    if width % group_size:
        raise ValueError(f"gated_rms_norm: width {width} is not a multiple of group_size {group_size}")
    h = (x.astype(F32) * _silu(gate.astype(F32))).reshape(tokens, width // group_size, group_size)
    h = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + F32(eps))
    return (h.reshape(tokens, width) * weight.astype(F32)).astype(x.dtype)


def relu_squared_reference(x: np.ndarray) -> np.ndarray:
    """``max(x, 0) ** 2`` elementwise (fp32 math), in ``x``'s dtype."""
    return np.square(np.maximum(x.astype(F32), F32(0))).astype(x.dtype)


# ---- the op group --------------------------------------------------------------------------------


class Mamba2Ops(OpGroup):
    """The mamba2 op group: every op defaults to its NumPy reference run on the host; a backend's
    native implementation (registered through ``register_op_implementations``) overrides them."""

    name = "mamba2"

    def causal_conv1d(
        self,
        x: Array,
        weight: Array,
        bias: Array | None,
        conv_state: Array,
        query_start_loc: Array,
        state_slots: Array,
        checkpoints: Array | None = None,
    ) -> Array:
        """Depthwise causal conv1d + SiLU per sequence, continuing from ``conv_state [S, C, K-1]`` and
        updating it in place, with the windows of ``checkpoints`` (`causal_conv1d_reference`). ``x [T, C]``
        activations -> new ``[T, C]``."""
        with host_state(self.backend, conv_state) as (state,):
            return on_host(
                self.backend,
                causal_conv1d_reference,
                x,
                weight,
                bias,
                state,
                query_start_loc,
                state_slots,
                checkpoints,
            )

    def mamba2_scan(
        self,
        x: Array,
        dt: Array,
        A: Array,
        B: Array,
        C: Array,
        D: Array,
        dt_bias: Array,
        ssm_state: Array,
        query_start_loc: Array,
        state_slots: Array,
        chunk_size: int,
        dt_min: float = 0.0,
        dt_max: float = float("inf"),
        checkpoints: Array | None = None,
    ) -> Array:
        """Selective scan over a varlen batch from and into ``ssm_state [S, Hm, P, N]`` (float32, in
        place; with ``checkpoints``, the state after chosen tokens into other rows) -> new ``y [T, Hm, P]``
        (`mamba2_scan_reference`). ``chunk_size`` is the block length of the chunked form; the values do
        not depend on it beyond rounding."""
        with host_state(self.backend, ssm_state) as (state,):
            return on_host(
                self.backend,
                mamba2_scan_reference,
                x,
                dt,
                A,
                B,
                C,
                D,
                dt_bias,
                state,
                query_start_loc,
                state_slots,
                chunk_size,
                dt_min,
                dt_max,
                checkpoints,
            )

    def mamba2_decode(
        self,
        x: Array,
        dt: Array,
        A: Array,
        B: Array,
        C: Array,
        D: Array,
        dt_bias: Array,
        ssm_state: Array,
        state_slots: Array,
        dt_min: float = 0.0,
        dt_max: float = float("inf"),
    ) -> Array:
        """One scan step per sequence (decode), in place on ``ssm_state`` -> new ``y [B, Hm, P]``
        (`mamba2_decode_reference`); equal to `mamba2_scan` over one-token sequences."""
        with host_state(self.backend, ssm_state) as (state,):
            return on_host(
                self.backend, mamba2_decode_reference, x, dt, A, B, C, D, dt_bias, state, state_slots, dt_min, dt_max
            )

    def relu_squared(self, x: Array, out: Array | None = None) -> Array:
        """Squared ReLU ``max(x, 0) ** 2``, the activation of the Mamba-2 hybrids' (Nemotron-H) MLPs:
        ``x [T, I]`` -> ``[T, I]``; ``out`` (optional) receives the result and is returned."""
        result = on_host(self.backend, relu_squared_reference, x)
        if out is None:
            return result
        out[...] = result
        return out

    def gated_rms_norm(self, x: Array, gate: Array, weight: Array, eps: float, group_size: int) -> Array:
        """``rms_norm_per_group(x * silu(gate)) * weight`` (`gated_rms_norm_reference`) -> new ``[T, I]``."""
        return on_host(self.backend, gated_rms_norm_reference, x, gate, weight, eps, group_size)
