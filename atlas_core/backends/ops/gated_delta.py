"""Ops of the gated_delta group with a host fallback (see `atlas_core.backends.ops`).

The gated delta net (GDN) mixer of Qwen3-Next and Qwen3.5 uses the short causal convolution it shares
with Mamba-2 (`atlas_core.backends.ops.mamba2`, ``causal_conv1d``) and three ops of its own:

  * `GatedDeltaOps.gdn_gates`: the per-head decay ``g`` and write strength ``beta`` from the ``a`` and
    ``b`` projections;
  * `GatedDeltaOps.gated_delta_rule`: the gated delta rule over a varlen batch, reading and updating
    each sequence's ``[Hv, Dk, Dv]`` state in place (`GatedDeltaOps.gated_delta_rule_with_gates`: the two
    ops above as one, with the norm below optionally (`OutputNorm`), which the layer calls);
  * `GatedDeltaOps.rms_norm_silu_gate`: RMSNorm of the rule's output, then times ``silu(z)`` (the
    gate comes after the norm; Mamba-2's ``gated_rms_norm`` gates before it).

State arrays are indexed by state slot (`atlas_core.model.recurrent_state.RecurrentState`); every
sequence of a batch names its slot in ``state_slots[B]`` and its tokens in ``query_start_loc[B+1]``
(the `AttentionMetadata` convention). A zeroed slot is the state before a sequence's first token.

The rule has two equivalent forms: the recurrent one (one token at a time, used for decode) and the
chunked one (the WY / UT-transform form of DeltaNet over chunks of 64 tokens, used for prefill);
`gated_delta_recurrent` and `gated_delta_chunked` are both references and must agree.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from atlas_core.backends.ops import OpGroup, host_state, on_host
from atlas_core.backends.ops.checkpoints import check_checkpoints, checkpoint_segments

if TYPE_CHECKING:
    from atlas_core.backends.base import Array

CHUNK_SIZE = 64
"""Tokens per chunk of the chunked form (as flash-linear-attention and transformers use)."""
L2NORM_EPS = 1e-6
"""Epsilon of the q/k L2 normalisation: ``x * rsqrt(sum(x**2) + eps)``."""


@dataclass(frozen=True)
class OutputNorm:
    """The gated RMSNorm of a GDN layer's rule output (`GatedDeltaOps.rms_norm_silu_gate`): ``gate`` (z)
    ``[T, Hv, Dv]`` activations (a view of the projection), ``weight [Dv]``, ``eps``."""

    gate: Array
    weight: Array
    eps: float


# ---- NumPy references ----------------------------------------------------------------------------
def _silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp overflows to inf below -88: silu -> 0, as it should
        return x / (1.0 + np.exp(-x))


def _sequences(query_start_loc: np.ndarray, state_slots: np.ndarray, num_slots: int) -> list[tuple[int, int, int]]:
    """``(start, end, slot)`` of every sequence with tokens; a `ValueError` for a bad slot."""
    if len(set(np.asarray(state_slots).tolist())) != len(state_slots):
        raise ValueError(
            f"two sequences of one batch share a state slot: state_slots={np.asarray(state_slots).tolist()}"
        )
    spans = []
    for b in range(len(query_start_loc) - 1):
        start, end, slot = int(query_start_loc[b]), int(query_start_loc[b + 1]), int(state_slots[b])
        if end > start:
            if not 0 <= slot < num_slots:
                raise ValueError(f"sequence {b} has state slot {slot}, outside the state's {num_slots} slots")
            spans.append((start, end, slot))
    return spans


def gdn_gates_reference(
    a: np.ndarray, b: np.ndarray, a_log: np.ndarray, dt_bias: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """`GatedDeltaOps.gdn_gates` on host arrays: ``(g, beta)`` float32 ``[T, Hv]``."""
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    softplus = np.logaddexp(np.float32(0.0), a32 + dt_bias.astype(np.float32))
    g = -np.exp(a_log.astype(np.float32)) * softplus
    with np.errstate(over="ignore"):
        beta = 1.0 / (1.0 + np.exp(-b32))
    return g.astype(np.float32), beta.astype(np.float32)


def gated_delta_recurrent(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, state: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The gated delta rule one token at a time, for one sequence (float32).

    ``q``, ``k`` ``[L, H, Dk]`` (already normalised and scaled, one key head per value head), ``v``
    ``[L, H, Dv]``, ``g`` / ``beta`` ``[L, H]``, ``state`` ``[H, Dk, Dv]``. For each token:
    ``S = exp(g) S``; ``S += k ⊗ beta (v - kᵀS)``; ``o = qᵀS``. Returns ``(o [L, H, Dv], S)``.
    """
    s = state.astype(np.float32, copy=True)
    out = np.empty(v.shape, dtype=np.float32)
    for t in range(q.shape[0]):
        s *= np.exp(g[t])[:, None, None]
        predicted = np.einsum("hk,hkv->hv", k[t], s)
        delta = (v[t] - predicted) * beta[t][:, None]
        s += k[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hk,hkv->hv", q[t], s)
    return out, s


def gated_delta_chunked(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    state: np.ndarray,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[np.ndarray, np.ndarray]:
    """The gated delta rule over chunks of ``chunk_size`` tokens, for one sequence (float32); same
    arguments and results as `gated_delta_recurrent`.

    Within a chunk (``c`` = cumulative sum of ``g`` from the chunk start, ``D[i, j] = exp(c_i - c_j)``
    for ``j <= i``, else 0): the UT transform ``T = I + strictly_lower((beta k) kᵀ ∘ D)`` turns the
    chunk's sequential updates into ``U = T⁻¹ (beta v)`` and ``W = T⁻¹ (beta k ∘ exp(c))``; with the
    state ``S`` entering the chunk, ``V = U - W S``, ``o = (q ∘ exp(c)) S + ((q kᵀ) ∘ D) V`` and
    ``S' = exp(c_last) S + (k ∘ exp(c_last - c))ᵀ V``.
    """
    s = state.astype(np.float32, copy=True)
    # to [H, L, D] so that every product below is a batched matmul over heads
    qh, kh, vh = (np.ascontiguousarray(x.transpose(1, 0, 2), dtype=np.float32) for x in (q, k, v))
    gh, bh = (np.ascontiguousarray(x.T, dtype=np.float32) for x in (g, beta))
    out = np.empty(vh.shape, dtype=np.float32)
    for start in range(0, qh.shape[1], chunk_size):
        span = slice(start, start + chunk_size)
        qc, kc, vc, bc = qh[:, span], kh[:, span], vh[:, span], bh[:, span]
        n = qc.shape[1]
        c = np.cumsum(gh[:, span], axis=-1)
        lower = np.tril(np.ones((n, n), dtype=bool))
        decay = np.exp(np.where(lower, c[:, :, None] - c[:, None, :], -np.inf))
        k_beta = kc * bc[..., None]
        system = np.tril((k_beta @ kc.transpose(0, 2, 1)) * decay, -1) + np.eye(n, dtype=np.float32)
        u = np.linalg.solve(system, vc * bc[..., None])
        w = np.linalg.solve(system, k_beta * np.exp(c)[..., None])
        v_new = u - w @ s
        out[:, span] = (qc * np.exp(c)[..., None]) @ s + ((qc @ kc.transpose(0, 2, 1)) * decay) @ v_new
        last = c[:, -1:]
        s = s * np.exp(last)[..., None] + (kc * np.exp(last - c)[..., None]).transpose(0, 2, 1) @ v_new
    return out.transpose(1, 0, 2), s


def _l2_normalise(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float32)
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + np.float32(L2NORM_EPS))


def gated_delta_rule_reference(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    state: np.ndarray,
    query_start_loc: np.ndarray,
    state_slots: np.ndarray,
    *,
    scale: float,
    l2norm_qk: bool = True,
    checkpoints: np.ndarray | None = None,
) -> np.ndarray:
    """`GatedDeltaOps.gated_delta_rule` on host arrays (``state`` is updated in place, and its ``checkpoints``
    rows written): runs of one token take the recurrent form, longer ones the chunked form."""
    tokens, key_heads, key_dim = q.shape
    value_heads, value_dim = v.shape[1:]
    if k.shape != q.shape or value_heads % key_heads or state.shape[1:] != (value_heads, key_dim, value_dim):
        raise ValueError(
            f"gated_delta_rule: q {q.shape}, k {k.shape}, v {v.shape} and state {state.shape} do not fit "
            "(q, k [T, Hk, Dk], v [T, Hv, Dv] with Hv a multiple of Hk, state [S, Hv, Dk, Dv])"
        )
    check_checkpoints(checkpoints, tokens, state_slots, state.shape[0], query_start_loc)
    group = value_heads // key_heads
    out = np.zeros((tokens, value_heads, value_dim), dtype=np.float32)
    for start, end, slot in _sequences(query_start_loc, state_slots, state.shape[0]):
        for first, stop, checkpoint in checkpoint_segments(start, end, checkpoints):
            qs, ks = q[first:stop].astype(np.float32), k[first:stop].astype(np.float32)
            if l2norm_qk:
                qs, ks = _l2_normalise(qs), _l2_normalise(ks)
            qs = np.repeat(qs * np.float32(scale), group, axis=1)
            ks = np.repeat(ks, group, axis=1)
            form = gated_delta_recurrent if stop - first == 1 else gated_delta_chunked
            vs = v[first:stop].astype(np.float32)
            out[first:stop], state[slot] = form(qs, ks, vs, g[first:stop], beta[first:stop], state[slot])
            if checkpoint >= 0:
                state[checkpoint] = state[slot]
    return out


def rms_norm_silu_gate_reference(x: np.ndarray, gate: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """`GatedDeltaOps.rms_norm_silu_gate` on host arrays."""
    x32 = x.astype(np.float32)
    inv_rms = 1.0 / np.sqrt(np.mean(x32 * x32, axis=-1, keepdims=True) + np.float32(eps))
    return (x32 * inv_rms * weight.astype(np.float32) * _silu(gate.astype(np.float32))).astype(np.float32)


# ---- the op group --------------------------------------------------------------------------------
class GatedDeltaOps(OpGroup):
    """The gated_delta op group: every op defaults to its NumPy reference run on the host; a backend's
    native implementation (registered through ``register_op_implementations``) overrides them."""

    name = "gated_delta"

    def gdn_gates(self, a: Array, b: Array, a_log: Array, dt_bias: Array) -> tuple[Array, Array]:
        """``g = -exp(a_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)``, both float32 ``[T, Hv]``.

        ``a``, ``b`` ``[T, Hv]`` in any float dtype (may be column slices); ``a_log``, ``dt_bias`` ``[Hv]``.
        ``softplus(x) = log(1 + exp(x))``. Not in place.
        """
        g, beta = gdn_gates_reference(*(self.backend.to_numpy(t) for t in (a, b, a_log, dt_bias)))
        f32 = np.dtype(np.float32)
        return self.backend.from_numpy(g, dtype=f32), self.backend.from_numpy(beta, dtype=f32)

    def gated_delta_rule(
        self,
        q: Array,
        k: Array,
        v: Array,
        g: Array,
        beta: Array,
        state: Array,
        query_start_loc: Array,
        state_slots: Array,
        *,
        scale: float,
        l2norm_qk: bool = True,
        checkpoints: Array | None = None,
    ) -> Array:
        """The gated delta rule of every sequence of a varlen batch, continuing from its state.

        ``q``, ``k`` ``[T, Hk, Dk]``, ``v`` ``[T, Hv, Dv]`` activations (Hv a multiple of Hk: value head
        h reads key head ``h // (Hv / Hk)``); ``g``, ``beta`` ``[T, Hv]`` float32 (`gdn_gates`); ``state``
        ``[S, Hv, Dk, Dv]`` float32, row ``state_slots[b]`` is sequence b's state ``S``, updated in place.
        With ``l2norm_qk``, q and k are first divided by ``sqrt(sum(x**2) + 1e-6)`` over Dk; q is then
        multiplied by ``scale``. Per token, in order: ``S = exp(g) S``; ``S += k ⊗ beta (v - kᵀS)``;
        output ``qᵀS`` -> ``[T, Hv, Dv]`` activations. Math in float32; a kernel may use the chunked
        form for prefill and the recurrent form for decode (`gated_delta_chunked`,
        `gated_delta_recurrent`): results agree to rounding. ``checkpoints``: the state after chosen tokens
        also written to other rows of ``state`` (`atlas_core.backends.ops.checkpoints`).
        """
        reference = functools.partial(gated_delta_rule_reference, scale=scale, l2norm_qk=l2norm_qk)
        with host_state(self.backend, state) as (state_on_host,):
            return on_host(
                self.backend,
                reference,
                q,
                k,
                v,
                g,
                beta,
                state_on_host,
                query_start_loc,
                state_slots,
                checkpoints=checkpoints,
            )

    def gated_delta_rule_with_gates(
        self,
        q: Array,
        k: Array,
        v: Array,
        a: Array,
        b: Array,
        a_log: Array,
        dt_bias: Array,
        state: Array,
        query_start_loc: Array,
        state_slots: Array,
        *,
        scale: float,
        l2norm_qk: bool = True,
        norm: OutputNorm | None = None,
        checkpoints: Array | None = None,
    ) -> Array:
        """`gated_delta_rule` with its ``g`` and ``beta`` from `gdn_gates` over ``a``, ``b``, ``a_log`` and
        ``dt_bias``, and with ``norm`` its output through `rms_norm_silu_gate`: one op, so that a backend can
        compute the gates and the norm inside the rule's kernel. The same results as the ops in turn (this
        default runs them)."""
        g, beta = self.gdn_gates(a, b, a_log, dt_bias)
        core = self.gated_delta_rule(
            q,
            k,
            v,
            g,
            beta,
            state,
            query_start_loc,
            state_slots,
            scale=scale,
            l2norm_qk=l2norm_qk,
            checkpoints=checkpoints,
        )
        return core if norm is None else self.rms_norm_silu_gate(core, norm.gate, norm.weight, norm.eps)

    def rms_norm_silu_gate(self, x: Array, gate: Array, weight: Array, eps: float) -> Array:
        """``x / sqrt(mean(x**2) + eps) * weight * silu(gate)`` over the last axis -> a new array of ``x``'s
        shape in the activation dtype. ``x``, ``gate`` ``[..., D]`` (same shape), ``weight[D]``; float32 math.
        """
        return on_host(self.backend, functools.partial(rms_norm_silu_gate_reference, eps=eps), x, gate, weight)
