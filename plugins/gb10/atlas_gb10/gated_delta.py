"""The ``gated_delta`` op group on CUDA (kernels in ``kernels/recurrent.cu``).

``gdn_gates`` is one elementwise kernel. ``gated_delta_rule`` is one kernel for decode and prefill alike:
a block per (32 value dims, value head, sequence) keeps its slice of the fp32 state ``[Dk, 32]`` in
registers for the whole sequence and walks the tokens in order (the recurrent form), with the q/k L2 norms,
the scale, the decay and beta fused; the state row of the sequence's slot is read once and written once.
``rms_norm_silu_gate`` is a warp per (token, head). Nothing reads device data on the host except the
slot check (`atlas_gb10.recurrent.check_state_slots`, skipped under graph capture), so decode steps capture.
"""

from __future__ import annotations

import math

import numpy as np

from atlas_core.backends.base import Array
from atlas_core.backends.ops.gated_delta import GatedDeltaOps
from atlas_gb10.arrays import element_strides
from atlas_gb10.backend import CudaBackend
from atlas_gb10.recurrent import F32, check_state_slots, float32, gated_rms_norm, grid_stride_blocks, kernel

ROWS_PER_THREAD = 16
"""``GDN_ROWS`` of ``recurrent.cu``: key dims of the state each thread holds; a block has ceil(Dk / 16) warps."""
MAX_KEY_DIM = 128
"""The widest key head the kernel takes (``GDN_MAX_WARPS`` warps of 16 rows); wider ones use the host fallback."""


class CudaGatedDeltaOps(GatedDeltaOps):
    """`GatedDeltaOps` with every op a CUDA kernel; inputs, outputs and the state stay on the device."""

    backend: CudaBackend

    def gdn_gates(self, a: Array, b: Array, a_log: Array, dt_bias: Array) -> tuple[Array, Array]:
        backend = self.backend
        backend.require_bf16("gdn_gates", a, b)
        a, b = backend.contiguous_rows(a), backend.contiguous_rows(b)
        tokens, heads = a.shape
        g = backend.cp.empty((tokens, heads), dtype=F32)
        beta = backend.cp.empty((tokens, heads), dtype=F32)
        if tokens * heads:
            kernel(backend, "gdn_gates_bf16")(
                (grid_stride_blocks(backend, tokens * heads),),
                (256,),
                (
                    a,
                    np.int64(element_strides(a)[0]),
                    b,
                    np.int64(element_strides(b)[0]),
                    float32(backend, a_log),
                    float32(backend, dt_bias),
                    g,
                    beta,
                    np.int32(heads),
                    np.int64(tokens),
                ),
            )
        return g, beta

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
    ) -> Array:
        backend = self.backend
        tokens, key_heads, key_dim = q.shape
        value_heads, value_dim = v.shape[1:]
        if k.shape != q.shape or value_heads % key_heads or tuple(state.shape[1:]) != (value_heads, key_dim, value_dim):
            raise ValueError(
                f"gated_delta_rule: q {q.shape}, k {k.shape}, v {v.shape} and state {state.shape} do not fit "
                "(q, k [T, Hk, Dk], v [T, Hv, Dv] with Hv a multiple of Hk, state [S, Hv, Dk, Dv])"
            )
        if key_dim > MAX_KEY_DIM:
            return super().gated_delta_rule(
                q, k, v, g, beta, state, query_start_loc, state_slots, scale=scale, l2norm_qk=l2norm_qk
            )
        check_state_slots(backend, state_slots, state.shape[0])
        if state.dtype != F32 or not state.flags.c_contiguous:
            raise TypeError(f"gated_delta_rule: the state must be a contiguous float32 array, got {state.dtype}")
        backend.require_bf16("gated_delta_rule", q, k, v)
        q, k, v = (backend.contiguous_rows(x) for x in (q, k, v))
        out = backend.cp.empty((tokens, value_heads, value_dim), dtype=q.dtype)
        num_seqs = state_slots.shape[0]
        if tokens == 0 or num_seqs == 0:
            return out
        qs, ks, vs = element_strides(q), element_strides(k), element_strides(v)
        kernel(backend, "gated_delta_rule_bf16")(
            (math.ceil(value_dim / 32), value_heads, num_seqs),
            (32 * math.ceil(key_dim / ROWS_PER_THREAD),),
            (
                q,
                np.int64(qs[0]),
                np.int64(qs[1]),
                k,
                np.int64(ks[0]),
                np.int64(ks[1]),
                v,
                np.int64(vs[0]),
                np.int64(vs[1]),
                float32(backend, g),
                float32(backend, beta),
                state,
                query_start_loc,
                state_slots,
                out,
                np.int32(key_heads),
                np.int32(value_heads),
                np.int32(key_dim),
                np.int32(value_dim),
                np.float32(scale),
                np.int32(l2norm_qk),
            ),
        )
        return out

    def rms_norm_silu_gate(self, x: Array, gate: Array, weight: Array, eps: float) -> Array:
        return gated_rms_norm(self.backend, x, gate, weight, eps, x.shape[-1], gate_first=False)
