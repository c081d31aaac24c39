"""The ``mamba2`` op group on CUDA (kernels in ``kernels/recurrent.cu`` and ``kernels/chunked_scan.cu``).

``causal_conv1d`` (also the gated delta net's convolution): decode-sized batches take one kernel, a
thread per (channel, sequence) sliding its window over the sequence's rows and leaving the last K - 1
inputs in the state row; larger batches compute the outputs a thread per (channel, row) and then update
the state rows with the same per-sequence kernel (outputs off). That kernel also stores the windows of
checkpointed tokens. ``mamba2_scan`` and ``mamba2_decode`` are one recurrent kernel: a warp per (8 head
dims, head, sequence) keeps those rows of the fp32 SSM state in registers and walks the sequence's tokens
in order, with dt bias, softplus, the dt limits and the D skip fused, storing the state after checkpointed
tokens (sequences with checkpoints are shorter than a chunk). Outside the batch-invariant mode, sequences
with at least 64 tokens in a ``mamba2_scan`` call take the chunked form instead (SSD over 64-token chunks on
the tensor cores, ``kernels/chunked_scan.cu``); the kernels' chunks are their own, whatever the model's
``chunk_size``.
``gated_rms_norm`` is a warp per (token, group), ``relu_squared`` elementwise. Decode steps read nothing
back to the host, so they capture.
"""

from __future__ import annotations

import math

import numpy as np

from atlas_core.backends.base import Array
from atlas_core.backends.ops.mamba2 import Mamba2Ops
from atlas_gb10.arrays import element_strides, null_or
from atlas_gb10.backend import CudaBackend
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

CONV_MAX_TAPS = 8
"""``CONV_MAX_K`` of ``recurrent.cu``: the widest convolution the kernels take (wider: host fallback)."""
CONV_THREADS = 128
SCAN_THREADS, SCAN_ROWS_PER_BLOCK = 128, 32
"""A scan block: ``SSM_WARPS`` (4) warps of ``SSM_ROWS`` (8) head dims."""
SCAN_LANE_STATES = (1, 2, 4, 8)
"""State entries per lane of the scan kernels (``mamba2_scan_n{1,2,4,8}_bf16``): state sizes up to 256."""
MAX_GRID_Y = 65535


def lane_states(state_size: int) -> int | None:
    """The scan kernel's state entries per lane for ``state_size`` (None above 256: the host fallback)."""
    return next((n for n in SCAN_LANE_STATES if 32 * n >= state_size), None)


class CudaMamba2Ops(Mamba2Ops):
    """`Mamba2Ops` with every op a CUDA kernel; inputs, outputs and the state stay on the device."""

    backend: CudaBackend

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
        backend, cp = self.backend, self.backend.cp
        tokens, channels = x.shape
        taps = weight.shape[1]
        if tuple(conv_state.shape[1:]) != (weight.shape[0], taps - 1) or channels != weight.shape[0]:
            raise ValueError(
                f"causal_conv1d: x {x.shape}, weight {weight.shape} and conv_state {conv_state.shape} do not agree "
                "(expected x [T, C], weight [C, K], conv_state [S, C, K-1])"
            )
        if taps > CONV_MAX_TAPS:
            return super().causal_conv1d(x, weight, bias, conv_state, query_start_loc, state_slots, checkpoints)
        backend.require_bf16("causal_conv1d", x, weight, bias, conv_state)
        check_state_slots(backend, state_slots, conv_state.shape[0], checkpoints, tokens, query_start_loc)
        if not conv_state.flags.c_contiguous:
            raise ValueError("causal_conv1d: the conv state must be contiguous")
        x = backend.contiguous_rows(x)
        out = cp.empty((tokens, channels), dtype=x.dtype)
        num_seqs = state_slots.shape[0]
        if tokens == 0 or num_seqs == 0:
            return out
        weight = cp.ascontiguousarray(weight)
        bias = None if bias is None else cp.ascontiguousarray(bias)
        ldx = np.int64(element_strides(x)[0])
        channel_blocks = math.ceil(channels / CONV_THREADS)
        per_sequence = kernel(backend, "conv1d_sequences_bf16")
        common = (
            weight,
            null_or(bias),
            conv_state,
            query_start_loc,
            state_slots,
            out,
            np.int32(channels),
            np.int32(taps),
        )
        decode_sized = tokens <= 2 * num_seqs
        if not decode_sized:
            kernel(backend, "conv1d_tokens_bf16")(
                (channel_blocks, min(tokens, MAX_GRID_Y)),
                (CONV_THREADS,),
                (x, ldx, *common, np.int32(num_seqs), np.int32(tokens)),
            )
        per_sequence(
            (channel_blocks, num_seqs),
            (CONV_THREADS,),
            (x, ldx, *common, np.int32(decode_sized), null_or(checkpoints)),
        )
        return out

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
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        arguments = (x, dt, A, B, C, D, dt_bias, ssm_state, query_start_loc, state_slots)
        if lane_states(B.shape[-1]) is None:
            return super().mamba2_scan(*arguments, chunk_size, dt_min, dt_max, checkpoints)
        return self._scan(*arguments, dt_min, dt_max, checkpoints)

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
        if lane_states(B.shape[-1]) is None:
            return super().mamba2_decode(x, dt, A, B, C, D, dt_bias, ssm_state, state_slots, dt_min, dt_max)
        return self._scan(x, dt, A, B, C, D, dt_bias, ssm_state, None, state_slots, dt_min, dt_max, None)

    def _scan(
        self,
        x: Array,
        dt: Array,
        A: Array,
        B: Array,
        C: Array,
        D: Array,
        dt_bias: Array,
        ssm_state: Array,
        query_start_loc: Array | None,
        state_slots: Array,
        dt_min: float,
        dt_max: float,
        checkpoints: Array | None,
    ) -> Array:
        """`mamba2_scan` over the sequences of ``query_start_loc``, or with None one token per sequence
        (`mamba2_decode`); the state size must have `lane_states`. Sequences with checkpoints are shorter than a
        chunk, so the recurrent kernel writes them."""
        backend, cp = self.backend, self.backend.cp
        tokens, heads, head_dim = x.shape
        groups, state_size = B.shape[1:]
        if heads % groups or tuple(ssm_state.shape[1:]) != (heads, head_dim, state_size) or C.shape != B.shape:
            raise ValueError(
                f"mamba2 scan: x {x.shape}, B {B.shape}, C {C.shape} and ssm_state {ssm_state.shape} do not fit "
                "(x [T, Hm, P], B/C [T, G, N] with Hm a multiple of G, ssm_state [S, Hm, P, N])"
            )
        backend.require_bf16("mamba2 scan", x, dt, B, C)
        check_state_slots(backend, state_slots, ssm_state.shape[0], checkpoints, tokens, query_start_loc)
        if ssm_state.dtype != F32 or not ssm_state.flags.c_contiguous:
            raise TypeError(f"mamba2 scan: the SSM state must be a contiguous float32 array, got {ssm_state.dtype}")
        x, dt, B, C = (backend.contiguous_rows(a) for a in (x, dt, B, C))
        out = cp.empty((tokens, heads, head_dim), dtype=x.dtype)
        num_seqs = state_slots.shape[0]
        if tokens == 0 or num_seqs == 0:
            return out
        xs, bs, cs = element_strides(x), element_strides(B), element_strides(C)
        arguments = (
            *(x, np.int64(xs[0]), np.int64(xs[1]), dt, np.int64(element_strides(dt)[0])),
            *(float32(backend, A), float32(backend, D), float32(backend, dt_bias)),
            *(B, np.int64(bs[0]), np.int64(bs[1]), C, np.int64(cs[0]), np.int64(cs[1])),
            *(ssm_state, null_or(query_start_loc), state_slots, out),
            *(np.int32(heads), np.int32(groups), np.int32(head_dim), np.int32(state_size)),
            *(np.float32(dt_min), np.float32(dt_max)),
        )
        chunked = None
        if query_start_loc is not None:
            chunked = chunked_kernel(backend, "mamba2", (x, B, C), state_size, head_dim, num_seqs)
        chunk_from = np.int32(CHUNK_TOKENS if chunked else NO_CHUNKS)
        kernel(backend, f"mamba2_scan_n{lane_states(state_size)}_bf16")(
            (math.ceil(head_dim / SCAN_ROWS_PER_BLOCK), heads, num_seqs),
            (SCAN_THREADS,),
            (*arguments, chunk_from, null_or(checkpoints)),
        )
        if chunked:
            chunked_scan, smem = chunked
            chunked_scan(
                (math.ceil(head_dim / CHUNKED_VALUE_COLUMNS), heads, num_seqs),
                (CHUNKED_THREADS,),
                (*arguments, chunk_from),
                shared_mem=smem,
            )
        return out

    def gated_rms_norm(self, x: Array, gate: Array, weight: Array, eps: float, group_size: int) -> Array:
        return gated_rms_norm(self.backend, x, gate, weight, eps, group_size, gate_first=True)

    def relu_squared(self, x: Array, out: Array | None = None) -> Array:
        backend = self.backend
        backend.require_bf16("relu_squared", x, out)
        x = backend.contiguous_rows(x)
        rows, cols = x.shape
        if out is None:
            out = backend.cp.empty((rows, cols), dtype=x.dtype)
        if rows * cols:
            kernel(backend, "relu_squared_bf16")(
                (grid_stride_blocks(backend, rows * cols),),
                (256,),
                (
                    x,
                    np.int64(element_strides(x)[0]),
                    out,
                    np.int64(element_strides(out)[0]),
                    np.int32(cols),
                    np.int64(rows),
                ),
            )
        return out
