"""What the cuda backend's recurrent-layer op groups share (`atlas_gb10.gated_delta`, `atlas_gb10.mamba2`):
the kernel module (``kernels/recurrent.cu``), the check of a batch's state slots, float32 parameters, and
the gated RMSNorm both groups use in their own variant.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from atlas_core.backends.base import Array
from atlas_core.backends.ops.checkpoints import check_checkpoints
from atlas_gb10.arrays import element_strides
from atlas_gb10.launch import Kernel

F32 = np.dtype(np.float32)
MODULE = "recurrent"
"""The registry op of ``kernels/recurrent.cu``."""
NORM_ROWS_PER_BLOCK = 4
"""Rows of ``gated_rms_norm_bf16`` per 128-thread block (a warp each)."""
CHUNKED_MODULE = "chunked_scan"
"""The registry op of ``kernels/chunked_scan.cu``."""
CHUNK_TOKENS = 64
"""Tokens per chunk of the chunked forms; a sequence with at least this many tokens in a call takes them."""
CHUNKED_KEY_TILES = (1, 2, 4, 8)
"""Key (Mamba-2: state) sizes / 16 with a chunked kernel (``k1``, ``k2``, ``k4``, ``k8``)."""
CHUNKED_THREADS = 128
CHUNKED_VALUE_COLUMNS = 32
"""Value dims (Mamba-2: head dims) per block of a chunked kernel."""
NO_CHUNKS = 2**31 - 1
"""``chunk_from`` of a recurrent launch that takes every sequence."""


def kernel(backend: Any, name: str) -> Any:
    """Kernel ``name`` of ``recurrent.cu`` for the backend's hardware target."""
    return backend.kernels.function(MODULE, name)


def grid_stride_blocks(backend: Any, total: int, threads: int = 256) -> int:
    """Blocks of a grid-stride loop over ``total`` elements: enough to fill the GPU, at most one per chunk."""
    return max(1, min(math.ceil(total / threads), 8 * max(1, backend.profile.sm_count)))


class _LastChecked:
    """The state-slot and checkpoint arrays `check_state_slots` validated last (held, so that they cannot be other
    arrays reusing their ids)."""

    slots: Any = None
    checkpoints: Any = None


def check_state_slots(
    backend: Any,
    state_slots: Array,
    num_slots: int,
    checkpoints: Array | None = None,
    tokens: int = 0,
    query_start_loc: Array | None = None,
) -> None:
    """Raise `ValueError` when a slot lies outside ``[-1, num_slots)`` or two sequences share a slot (-1, a
    padding row that reads and writes no state, may repeat), or when ``checkpoints`` (one entry per token of the
    ``tokens``, sequences at ``query_start_loc``) breaks `atlas_core.backends.ops.checkpoints.check_checkpoints`.

    The check reads the slots on the host, a synchronisation, so it runs once per slot array (every layer of
    a forward receives the same arrays, which must not be modified in place afterwards) and never while the
    current stream is capturing a CUDA graph (graphs fill their slot buffers on the device).
    """
    if backend.cp.cuda.get_current_stream().is_capturing():
        return
    if checkpoints is not None and checkpoints is not _LastChecked.checkpoints:
        starts = None if query_start_loc is None else backend.to_numpy(query_start_loc)
        check_checkpoints(backend.to_numpy(checkpoints), tokens, backend.to_numpy(state_slots), num_slots, starts)
        _LastChecked.checkpoints = checkpoints
    if state_slots is _LastChecked.slots:
        return
    slots = backend.to_numpy(state_slots).astype(np.int64)
    owned = slots[slots >= 0]
    if (slots < -1).any() or (owned >= num_slots).any():
        raise ValueError(f"state slots {slots.tolist()} are outside the state's {num_slots} slots (-1: none)")
    if len(np.unique(owned)) != len(owned):
        raise ValueError(f"two sequences of one batch share a state slot: state_slots={slots.tolist()}")
    _LastChecked.slots = state_slots


def chunked_kernel(
    backend: Any, family: str, inputs: tuple[Array, ...], key_dim: int, value_dim: int, num_seqs: int
) -> tuple[Kernel, int] | None:
    """(kernel, shared bytes) of ``family``'s chunked form (``gated_delta`` or ``mamba2``) for a call over ``inputs``
    (its token-major activations), or None where every sequence takes the recurrent form: the batch-invariant
    mode, a call in which no sequence can have `CHUNK_TOKENS` tokens (decode and verify steps), a graph capture,
    key sizes other than 16, 32, 64 or 128, value sizes not a multiple of 8, rows not 16-byte aligned, or too
    little shared memory per block."""
    tokens, tiles = inputs[0].shape[0], key_dim // 16
    if (
        backend.batch_invariant
        or tokens - num_seqs + 1 < CHUNK_TOKENS
        or key_dim % 16
        or tiles not in CHUNKED_KEY_TILES
        or value_dim % 8
        or backend.cp.cuda.get_current_stream().is_capturing()
    ):
        return None
    for x in inputs:
        if x.data.ptr % 16 or any(stride % 8 for stride in element_strides(x)[:-1]):
            return None
    sizes = backend.kernels.constants(CHUNKED_MODULE, "chunked_scan_shared_bytes", len(CHUNKED_KEY_TILES))
    smem = sizes[CHUNKED_KEY_TILES.index(tiles)]
    if smem > backend.profile.shared_memory_per_block:
        return None
    chunked = backend.kernels.function(CHUNKED_MODULE, f"{family}_chunked_k{tiles}_bf16")
    if smem > 48 * 1024:
        chunked.max_dynamic_shared_size_bytes = smem
    return chunked, smem


def float32(backend: Any, x: Array) -> Array:
    """``x`` as a contiguous float32 array (itself when it already is one: the loaders upload per-head
    parameters as float32, so a forward makes no copy)."""
    if x.dtype == F32 and x.flags.c_contiguous:
        return x
    return backend.cp.ascontiguousarray(x, dtype=F32)


def _row_layout(x: Array, group: int) -> tuple[int, int, int, int] | None:
    """x's rows of ``group`` elements as (outer, inner) pairs: ``(inner_count, outer stride, inner stride,
    weight stride)`` in elements. ``[T, H, D]`` with ``group == D``: (token, head), every head normed with the
    same weights; ``[T, W]``: (token, group of W), group g with ``weight[g * group:]``. None: copy x first."""
    if x.strides[-1] != x.itemsize:
        return None
    strides = element_strides(x)
    if x.ndim == 3 and group == x.shape[2]:
        return x.shape[1], strides[0], strides[1], 0
    if x.ndim == 2:
        return x.shape[1] // group, strides[0], group, group
    return None


def gated_rms_norm(
    backend: Any, x: Array, gate: Array, weight: Array, eps: float, group: int, *, gate_first: bool
) -> Array:
    """RMSNorm with a SiLU gate over consecutive groups of ``group`` elements of the last axis (W wide), as
    a new contiguous array of ``x``'s shape. ``gate_first``: ``h = x * silu(gate)``, ``h / rms(h) * weight``
    (Mamba-2's ``gated_rms_norm``); otherwise ``x / rms(x) * weight * silu(gate)`` (the gated delta net's
    ``rms_norm_silu_gate``, ``group == W``). ``weight [W]``; ``rms(h) = sqrt(mean(h**2) + eps)``; float32 math."""
    backend.require_bf16("gated rms norm", x, gate, weight)
    width = x.shape[-1]
    if gate.shape != x.shape or width % group or weight.shape != (width,):
        raise ValueError(
            f"gated rms norm: x {tuple(x.shape)}, gate {tuple(gate.shape)} and weight {tuple(weight.shape)} do not fit "
            f"(x and gate of one shape, the last axis a multiple of {group}, weight as wide as it)"
        )
    out = backend.cp.empty(x.shape, dtype=x.dtype)
    rows = math.prod(x.shape) // group
    if rows == 0:
        return out
    layouts = [_row_layout(a, group) for a in (x, gate)]
    if None in layouts or layouts[0][0] != layouts[1][0]:  # type: ignore[index]
        x, gate = (backend.cp.ascontiguousarray(a).reshape(-1, width) for a in (x, gate))
        layouts = [_row_layout(a, group) for a in (x, gate)]
    (inner_count, x_outer, x_inner, w_inner), (_, g_outer, g_inner, _) = layouts  # type: ignore[misc]
    kernel(backend, "gated_rms_norm_bf16")(
        (math.ceil(rows / NORM_ROWS_PER_BLOCK),),
        (32 * NORM_ROWS_PER_BLOCK,),
        (
            x,
            np.int64(x_outer),
            np.int64(x_inner),
            gate,
            np.int64(g_outer),
            np.int64(g_inner),
            np.int32(inner_count),
            backend.cp.ascontiguousarray(weight),
            np.int64(w_inner),
            out,
            np.float32(eps),
            np.int32(group),
            np.int64(rows),
            np.int32(gate_first),
        ),
    )
    return out
