"""The ``gated_delta`` op group on CUDA (kernels in ``kernels/recurrent.cu`` and ``kernels/chunked_scan.cu``).

``gdn_gates`` is one elementwise kernel. ``gated_delta_rule`` takes one of two forms per sequence, with the q/k
L2 norms, the scale, the decay and beta fused in both, and the state row of the sequence's slot read once and
written once:

* the recurrent form (``gated_delta_rule_bf16``): a block per (32 value dims, value head, sequence) keeps its
  slice of the fp32 state ``[Dk, 32]`` in registers and walks the tokens in order, storing it after the tokens
  that have checkpoints. Decode, verify steps (sequences with checkpoints are shorter than a chunk) and every
  sequence in the batch-invariant mode take it: its bits do not depend on how a prompt is cut into calls.
* the chunked form (``gated_delta_chunked_k*_bf16``), for sequences with at least `CHUNK_TOKENS` tokens in a
  call outside the batch-invariant mode: 64 tokens at a time on the tensor cores (the kernel's header states
  the algebra), the prefill path.

``rms_norm_silu_gate`` is a warp per (token, head); where the layer passes its norm to
``gated_delta_rule_with_gates`` and no sequence is chunked, the recurrent kernel applies it itself
(``gated_delta_rule_normed_c*``: the blocks of a head in a thread-block cluster share their outputs through
distributed shared memory), with the same bits, one launch fewer per layer. Nothing reads device data on the
host except the slot check (`atlas_gb10.recurrent.check_state_slots`, skipped under graph capture), so decode
steps capture.
"""

from __future__ import annotations

import math

import numpy as np

from atlas_core.backends.base import Array
from atlas_core.backends.ops.gated_delta import GatedDeltaOps, OutputNorm
from atlas_gb10.arrays import element_strides, null_or
from atlas_gb10.backend import CudaBackend
from atlas_gb10.launch import Kernel, supports_clusters
from atlas_gb10.recurrent import (
    CHUNK_TOKENS,
    CHUNKED_THREADS,
    CHUNKED_VALUE_COLUMNS,
    F32,
    NO_CHUNKS,
    check_state_slots,
    chunked_kernel,
    float32,
    gated_rms_norm,
    grid_stride_blocks,
    kernel,
)

ROWS_PER_THREAD = 16
"""``GDN_ROWS`` of ``recurrent.cu``: key dims of the state each thread holds; a block has ceil(Dk / 16) warps."""
MAX_KEY_DIM = 128
"""The widest key head the kernel takes (``GDN_MAX_WARPS`` warps of 16 rows); wider ones use the host fallback."""
NORMED_CLUSTERS = (1, 2, 4)
"""Blocks per head of the ``gated_delta_rule_normed_c*`` kernels (value heads up to 32, 64 and 128 wide)."""
NULL = np.uint64(0)
NO_GATES = (NULL, NULL)
"""``g`` and ``beta`` of a launch that computes the gates from the projections."""
NO_PROJECTIONS = (NULL, np.int64(0), NULL, np.int64(0), NULL, NULL)
"""``a``, ``lda``, ``b``, ``ldb``, ``a_log``, ``dt_bias`` of a launch that reads ``g`` and ``beta``."""


def normed_kernel(backend: CudaBackend, value_dim: int) -> Kernel | None:
    """The recurrent kernel that norms its own output for ``value_dim``-wide value heads: its ceil(Dv / 32)
    blocks of a head in one thread-block cluster (sm_90 and later; one block needs none), or None (Dv > 128, or
    more than one block before sm_90)."""
    blocks = math.ceil(value_dim / 32)
    if blocks not in NORMED_CLUSTERS or (blocks > 1 and not supports_clusters(backend.profile.arch)):
        return None
    return kernel(backend, f"gated_delta_rule_normed_c{blocks}_bf16")


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
        checkpoints: Array | None = None,
    ) -> Array:
        if q.shape[2] > MAX_KEY_DIM:
            return super().gated_delta_rule(
                *(q, k, v, g, beta, state, query_start_loc, state_slots),
                scale=scale,
                l2norm_qk=l2norm_qk,
                checkpoints=checkpoints,
            )
        gates = (float32(self.backend, g), float32(self.backend, beta), *NO_PROJECTIONS)
        return self._rule(q, k, v, gates, state, query_start_loc, state_slots, scale, l2norm_qk, None, checkpoints)

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
        """The gates computed by the rule's kernels as they read each token (the bits of `gdn_gates`), and the
        norm by the recurrent kernel where `normed_kernel` finds one (the bits of `rms_norm_silu_gate`)."""
        backend = self.backend
        if q.shape[2] > MAX_KEY_DIM:
            return super().gated_delta_rule_with_gates(
                q,
                k,
                v,
                a,
                b,
                a_log,
                dt_bias,
                state,
                query_start_loc,
                state_slots,
                scale=scale,
                l2norm_qk=l2norm_qk,
                norm=norm,
                checkpoints=checkpoints,
            )
        backend.require_bf16("gated_delta_rule_with_gates", a, b)
        a, b = backend.contiguous_rows(a), backend.contiguous_rows(b)
        gates = (
            *NO_GATES,
            a,
            np.int64(element_strides(a)[0]),
            b,
            np.int64(element_strides(b)[0]),
            float32(backend, a_log),
            float32(backend, dt_bias),
        )
        return self._rule(q, k, v, gates, state, query_start_loc, state_slots, scale, l2norm_qk, norm, checkpoints)

    def _rule(
        self,
        q: Array,
        k: Array,
        v: Array,
        gates: tuple[object, ...],
        state: Array,
        query_start_loc: Array,
        state_slots: Array,
        scale: float,
        l2norm_qk: bool,
        norm: OutputNorm | None,
        checkpoints: Array | None,
    ) -> Array:
        """The recurrent launch, and the chunked one where `chunked_kernel` finds one (sequences with checkpoints are
        shorter than its `CHUNK_TOKENS`: the recurrent kernel writes them); ``gates``: the ``GDN_GATE_PARAMS``
        arguments of ``recurrent_gates.cuh``; with ``norm``, the output normed (inside the recurrent kernel where
        `normed_kernel` finds one, else by `rms_norm_silu_gate` after the launches)."""
        backend = self.backend
        tokens, key_heads, key_dim = q.shape
        value_heads, value_dim = v.shape[1:]
        if k.shape != q.shape or value_heads % key_heads or tuple(state.shape[1:]) != (value_heads, key_dim, value_dim):
            raise ValueError(
                f"gated_delta_rule: q {q.shape}, k {k.shape}, v {v.shape} and state {state.shape} do not fit "
                "(q, k [T, Hk, Dk], v [T, Hv, Dv] with Hv a multiple of Hk, state [S, Hv, Dk, Dv])"
            )
        check_state_slots(backend, state_slots, state.shape[0], checkpoints, tokens, query_start_loc)
        if state.dtype != F32 or not state.flags.c_contiguous:
            raise TypeError(f"gated_delta_rule: the state must be a contiguous float32 array, got {state.dtype}")
        backend.require_bf16("gated_delta_rule", q, k, v)
        q, k, v = (backend.contiguous_rows(x) for x in (q, k, v))
        out = backend.cp.empty((tokens, value_heads, value_dim), dtype=q.dtype)
        num_seqs = state_slots.shape[0]
        if tokens == 0 or num_seqs == 0:
            return out
        qs, ks, vs = element_strides(q), element_strides(k), element_strides(v)
        inputs = (
            *(q, np.int64(qs[0]), np.int64(qs[1])),
            *(k, np.int64(ks[0]), np.int64(ks[1])),
            *(v, np.int64(vs[0]), np.int64(vs[1])),
            *gates,
            *(state, query_start_loc, state_slots, out),
            *(np.int32(key_heads), np.int32(value_heads)),
        )
        chunked = chunked_kernel(backend, "gated_delta", (q, k, v), key_dim, value_dim, num_seqs)
        chunk_from = np.int32(CHUNK_TOKENS if chunked else NO_CHUNKS)
        flags = (np.float32(scale), np.int32(l2norm_qk), chunk_from)
        recurrent = (*inputs, np.int32(key_dim), np.int32(value_dim), *flags, null_or(checkpoints))
        fused = None if norm is None or chunked else normed_kernel(backend, value_dim)
        if fused is not None and norm is not None:
            recurrent = (*recurrent, *self._norm_arguments(norm, out))
        (fused or kernel(backend, "gated_delta_rule_bf16"))(
            (math.ceil(value_dim / 32), value_heads, num_seqs), (32 * math.ceil(key_dim / ROWS_PER_THREAD),), recurrent
        )
        if chunked:
            chunked_rule, smem = chunked
            chunked_rule(
                (math.ceil(value_dim / CHUNKED_VALUE_COLUMNS), value_heads, num_seqs),
                (CHUNKED_THREADS,),
                (*inputs, np.int32(value_dim), *flags),
                shared_mem=smem,
            )
        if norm is not None and fused is None:
            return self.rms_norm_silu_gate(out, norm.gate, norm.weight, norm.eps)
        return out

    def _norm_arguments(self, norm: OutputNorm, out: Array) -> tuple[object, ...]:
        """The ``gated_delta_rule_normed_c*`` kernels' norm arguments (z, its strides, the weight, eps), checked
        against the rule's output ``out``."""
        backend = self.backend
        backend.require_bf16("gated_delta_rule_with_gates", norm.gate, norm.weight)
        if norm.gate.shape != out.shape or norm.weight.shape != out.shape[-1:]:
            raise ValueError(
                f"gated_delta_rule_with_gates: the norm's gate {norm.gate.shape} and weight {norm.weight.shape} "
                f"do not fit the output {out.shape} (gate of its shape, weight [Dv])"
            )
        z = backend.contiguous_rows(norm.gate)
        z_strides = element_strides(z)
        weight = backend.cp.ascontiguousarray(norm.weight)
        return z, np.int64(z_strides[0]), np.int64(z_strides[1]), weight, np.float32(norm.eps)

    def rms_norm_silu_gate(self, x: Array, gate: Array, weight: Array, eps: float) -> Array:
        return gated_rms_norm(self.backend, x, gate, weight, eps, x.shape[-1], gate_first=False)
