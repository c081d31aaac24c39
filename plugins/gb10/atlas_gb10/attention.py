"""Host side of paged attention: the work list, the kernel variant, split-K or direct, the launch.
16-row work items take the tensor-core decode kernel outside the batch-invariant mode (`attention_decode`).

Eager forwards read the batch's query starts and context lengths back once per forward (the result is
kept for the other layers of that forward) and build the work list: one item per (sequence, tile of
query tokens). When those items would leave most SMs idle and contexts span several splits, every item
is cut into its splits (flash-decoding) and `attention_combine` merges them. Captured decode graphs
install a `StaticAttentionPlan` instead, so nothing reads back or allocates on the host side.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from atlas_core.backends.base import AttentionMetadata
from atlas_gb10.arrays import cache_kind
from atlas_gb10.attention_decode import decode_kernel
from atlas_gb10.attention_work import (
    ForwardInputs,
    LaunchPlan,
    StaticAttentionPlan,
    longest_first,
    query_tiles,
    work_items,
)
from atlas_gb10.hardware import has_wgmma

THREADS = 128
HEAD_DIM_VARIANTS = (1, 2, 4, 8, 16)
"""Dims per lane of the attention kernels: head dims up to 32, 64, 128, 256 and 512 (Gemma 4's global
layers; 16-row blocks only, so GQA groups of at most 16)."""
WIDE = 16
"""The dims per lane of the widest heads: one key/value buffer, the running output in registers."""
MMA_HEAD_STEPS = (2, 4, 5, 6, 8, 16)
"""The tensor-core prefill kernels (attention_mma.cu): head dims padded to 16 x these (32 to 256), where the
device's shared memory per block holds their tiles (`mma_shared_bytes`)."""
MMA_TILE_N = 64
MMA_ROWS = 64
"""Rows of an attention_mma.cu item whose warps own 16 rows; `AttentionRunner.mma_rows` may double them."""
MMA_X2_MAX_STEPS = 8
"""The widest heads (16 x this) with 128-row attention_mma.cu kernels (``_x2``): wider ones need more registers."""
WGMMA_STEPS = 8
"""Heads padded to 16 x this (113 to 128 wide) take attention_wgmma.cu's kernel for 128-row items on Hopper."""
WGMMA_THREADS = 256
MAX_GRID_Y = 65535
"""CUDA's limit on a grid's second dimension (attention_wgmma.cu's items)."""


class AttentionRunner:
    """Plans and launches `Backend.attention` for one backend."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.cp = backend.cp
        variant = backend.kernels.variant("attention")
        self.tile_n = variant.define("ATT_TILE_N", 64)
        self.split = variant.define("ATT_SPLIT", 64)
        self.static: StaticAttentionPlan | None = None
        self.wgmma_prefill = has_wgmma(backend.profile.arch)
        """Whether 128-row prefill items of 128-wide heads over bf16 caches take attention_wgmma.cu (Hopper's
        warpgroup instructions) instead of attention_mma.cu's ``_x2`` kernel: other bits, within bf16 tolerance."""
        self.split_policy = "auto"
        """Eager forwards: "auto" (split-K when blocks would leave SMs idle), "always" or "never";
        results are identical."""
        self._forward: ForwardInputs | None = None

    def splits_for(self, context: int, split: int | None = None) -> int:
        """Splits of ``split`` keys (default: attention's) that cover ``context`` keys, at least 1."""
        return max(1, math.ceil(context / (split or self.split)))

    def static_work(self, num_seqs: int, splits: int, query_tokens: int = 1) -> StaticAttentionPlan:
        """One item per (sequence, split); with a single split, direct mode (no workspace, no combine).
        With several ``query_tokens`` per sequence, the items of each tile of them are derived when the
        tile size is known (`_plan`, in the eager warm-up)."""
        seqs = np.arange(num_seqs)
        work = work_items(seqs, np.zeros_like(seqs), splits if splits > 1 else 0)
        return StaticAttentionPlan(self.cp.asarray(work), splits if splits > 1 else 0, query_tokens=query_tokens)

    def __call__(
        self,
        q: Any,
        k_cache: Any,
        v_cache: Any,
        meta: AttentionMetadata,
        scale: float,
        out: Any,
        sliding_window: int | None,
        kv_scales: tuple[float, float] | None = None,
    ) -> Any:
        """Attention over bf16 caches, or over fp8 (E4M3) caches with their layer's ``kv_scales``: the fp8 kernels
        (``KV_FP8``) read one byte per element; the key scale multiplies the softmax scale, the value scale the
        output."""
        cp = self.cp
        dtype = cache_kind("attention", k_cache, v_cache, kv_scales)
        k_scale, v_scale = kv_scales or (1.0, 1.0)
        if not scale * k_scale > 0:  # the kernels take the row max of unscaled scores, then scale it
            raise ValueError(
                f"attention: the softmax scale times the key scale must be positive, got {scale * k_scale}"
            )
        scales = (scale * k_scale, v_scale)
        tokens, q_heads, d = q.shape
        _, block_size, kv_heads, _ = k_cache.shape
        if q.strides[-1] != q.itemsize:
            q = cp.ascontiguousarray(q)
        if q_heads % kv_heads:
            raise ValueError(f"attention: {q_heads} query heads are not a multiple of {kv_heads} KV heads")
        group = q_heads // kv_heads
        dpt = next((v for v in HEAD_DIM_VARIANTS if 32 * v >= d), None)
        if dpt is None or group > (16 if dpt == WIDE else 64):
            raise ValueError(
                f"attention: head_dim {d} (at most 512) or GQA group {group} "
                f"(at most 64; 16 for heads over 256) not supported"
            )
        if out is None:
            out = cp.empty(q.shape, dtype=q.dtype)
        if tokens == 0:
            return out
        steps = next((k for k in MMA_HEAD_STEPS if 16 * k >= d), None)
        tensor_cores = (
            steps is not None
            and mma_shared_bytes(steps) <= self.backend.profile.shared_memory_per_block
            and self.static is None
            and not self.backend.batch_invariant
        )
        mma_rows = self.mma_rows(steps) if tensor_cores and steps is not None else 0
        plan = self._plan(meta, group, tokens, kv_heads, max_rows=16 if dpt == WIDE else 64, mma_rows=mma_rows)
        tile_rows = plan.tile_rows
        if mma_rows and tile_rows == 64 and steps is not None:
            return self._tensor_core_prefill(
                q, k_cache, v_cache, meta, scales, out, sliding_window, plan, steps, mma_rows, dtype
            )
        if (
            tile_rows == 64
            and group <= 16
            and self.shared_bytes(64, dpt, d, dtype) > self.backend.profile.shared_memory_per_block
        ):
            tile_rows = 16  # same results (a row's arithmetic does not depend on the tile), less shared memory
            plan = self._plan(meta, group, tokens, kv_heads, max_rows=16)
        decode = decode_kernel(self.backend, d, self.split, dtype) if tile_rows == 16 else None
        if decode is not None:
            kernel, smem = decode
        else:
            kernel = self.backend.kernels.function("attention", f"attention_m{tile_rows}_d{dpt}", dtype)
            smem = self.shared_bytes(tile_rows, dpt, d, dtype)
            if smem > 48 * 1024:
                kernel.max_dynamic_shared_size_bytes = smem
        splits = max(plan.splits, 1)
        if plan.splits:
            ws_acc = cp.empty((tokens * q_heads * splits * d,), dtype=np.float32)
            ws_ml = cp.empty((tokens * q_heads * splits * 2,), dtype=np.float32)
        else:
            ws_acc = ws_ml = np.uint64(0)
        kernel(
            (plan.items, kv_heads),
            (THREADS,),
            _kernel_args(
                q, k_cache, v_cache, meta, plan.work, out, scales, sliding_window, (ws_acc, ws_ml, np.int32(splits))
            ),
            shared_mem=smem,
        )
        if plan.splits:
            rows = tokens * q_heads
            os_ = [s // out.itemsize for s in out.strides]
            self.backend.kernels.function("attention", "attention_combine", dtype)(
                (math.ceil(rows / 4),),
                (128,),
                (
                    ws_acc,
                    ws_ml,
                    np.int32(splits),
                    out,
                    np.int64(os_[0]),
                    np.int64(os_[1]),
                    np.int32(q_heads),
                    np.int32(d),
                    np.int64(rows),
                    np.float32(v_scale),
                ),
            )
        return out

    def _tensor_core_prefill(
        self,
        q: Any,
        k_cache: Any,
        v_cache: Any,
        meta: AttentionMetadata,
        scales: tuple[float, float],
        out: Any,
        sliding_window: int | None,
        plan: LaunchPlan,
        steps: int,
        rows: int,
        dtype: str,
    ) -> Any:
        """A direct-mode plan of ``rows``-row items (`mma_rows`) through attention_mma.cu (head dim padded to 16 x
        ``steps``), or attention_wgmma.cu where `wgmma_prefill` takes them."""
        kv_heads = k_cache.shape[2]
        kernels = self.backend.kernels
        if self.takes_wgmma(rows, steps, dtype, plan.items):
            # blocks (KV head, item): every head's longest items start first
            kernel = kernels.function("attention_wgmma", "attention_wgmma_d8")
            smem, threads = kernels.constants("attention_wgmma", "attention_wgmma_shared_bytes", 1)[0], WGMMA_THREADS
            grid = (kv_heads, plan.items)
        else:
            name = f"attention_mma_d{steps}" + ("_x2" if rows == 2 * MMA_ROWS else "")
            kernel = kernels.function("attention_mma", name, dtype)
            smem, threads, grid = mma_shared_bytes(steps, rows), THREADS, (plan.items, kv_heads)
        if smem > 48 * 1024:
            kernel.max_dynamic_shared_size_bytes = smem
        kernel(
            grid,
            (threads,),
            _kernel_args(q, k_cache, v_cache, meta, plan.work, out, scales, sliding_window),
            shared_mem=smem,
        )
        return out

    def takes_wgmma(self, rows: int, steps: int, dtype: str, items: int) -> bool:
        """Whether a tensor-core prefill launch of ``items`` items of ``rows`` rows, heads padded to 16 x ``steps``,
        over ``dtype`` caches runs attention_wgmma.cu (`wgmma_prefill`; its grid holds the items in its second
        dimension, at most `MAX_GRID_Y`) rather than attention_mma.cu."""
        return (
            self.wgmma_prefill
            and rows == 2 * MMA_ROWS
            and steps == WGMMA_STEPS
            and dtype == "bf16"
            and items <= MAX_GRID_Y
        )

    def mma_rows(self, steps: int) -> int:
        """Rows of an attention_mma.cu item for heads padded to 16 x ``steps``: 128 (warps of 32 rows, half the
        shared-memory reads a row) for heads up to 128 wide where the device's shared memory per block holds their
        tiles, else 64. Both give a row the same bits."""
        wide = (
            steps <= MMA_X2_MAX_STEPS
            and mma_shared_bytes(steps, 2 * MMA_ROWS) <= self.backend.profile.shared_memory_per_block
        )
        return 2 * MMA_ROWS if wide else MMA_ROWS

    def shared_bytes(self, tile_rows: int, dpt: int, d: int, dtype: str = "bf16") -> int:
        """attention.cu's shared memory for one block (``dtype``: the caches', ``bf16`` or ``fp8``, whose key and
        value tiles hold one byte per element)."""
        stride = ((d + 7) & ~7) + 8
        buffers = 2 if tile_rows == 16 and dpt < WIDE else 1  # ATT_BUFFERS in attention.cu
        running_output = 0 if dpt == WIDE else tile_rows * 32 * dpt * 4  # Ot (O_REGS: in registers)
        return (
            self.split * 8
            + tile_rows * stride * 2
            + 2 * buffers * self.tile_n * stride * (1 if dtype == "fp8" else 2)
            + tile_rows * (self.tile_n + 1) * 4
            + running_output
            + 7 * tile_rows * 4
        )

    def _plan(
        self,
        meta: AttentionMetadata,
        group: int,
        tokens: int,
        kv_heads: int,
        max_rows: int = 64,
        mma_rows: int = 0,
    ) -> LaunchPlan:
        """The work of one launch. ``mma_rows`` (the tensor-core prefill kernel's item rows; 0: not taken): an
        eager forward whose tiles take 64 rows runs items of that many rows in direct mode (the tensor-core prefill
        kernel, which has no split mode). An eager forward's plans are built once for all its layers."""
        static = self.static
        if static is not None and static.query_tokens == 1:
            return LaunchPlan(static.work, int(static.work.shape[0]), static.splits, 16 if group <= 16 else 64)
        if static is not None:  # a captured verify step: query tiles of the sequences' tokens
            tile_rows = 16 if static.query_tokens * group <= 16 or max_rows == 16 else 64
            key = f"tiles_{tile_rows}_{group}"
            if key not in static.derived:
                q_lens = np.full(static.num_seqs, static.query_tokens)
                static.derived[key] = self.cp.asarray(
                    work_items(*query_tiles(q_lens, tile_rows // group), static.splits)
                )
            work = static.derived[key]
            return LaunchPlan(work, int(work.shape[0]), static.splits, tile_rows)
        plans = self._forward_inputs(meta).plans
        shape = (group, tokens, kv_heads, max_rows, mma_rows)
        plan = plans.get(shape)
        if plan is None:
            plan = plans[shape] = self._eager_plan(meta, group, kv_heads, max_rows, mma_rows)
        return plan

    def _eager_plan(
        self, meta: AttentionMetadata, group: int, kv_heads: int, max_rows: int, mma_rows: int
    ) -> LaunchPlan:
        """`_plan` for an eager forward: its work list, built on the host and uploaded."""
        q_lens, lengths = self.host_lengths(meta)
        tile_rows = 16 if int(q_lens.max(initial=0)) * group <= 16 or max_rows == 16 else 64
        if mma_rows and tile_rows == 64:
            tokens = mma_rows // group
            work = work_items(*longest_first(*query_tiles(q_lens, tokens), q_lens, lengths, tokens), 0)
            return LaunchPlan(self.cp.asarray(work), len(work), 0, tile_rows)
        work, splits = self.work_list(q_lens, lengths, tile_rows // group, kv_heads, self.split)
        return LaunchPlan(self.cp.asarray(work), len(work), splits, tile_rows)

    def work_list(
        self,
        q_lens: np.ndarray,
        lengths: np.ndarray,
        tokens_per_tile: int,
        blocks_per_item: int,
        split: int,
    ) -> tuple[np.ndarray, int]:
        """The host work list of an eager forward and its split count (0: direct mode).

        One item (sequence, first query token, split or -1, 0) per tile of ``tokens_per_tile`` query
        tokens of a sequence. When those items, ``blocks_per_item`` blocks each, would leave SMs idle
        and contexts span several splits of ``split`` keys (or `split_policy` says "always"), every item
        is cut into its splits; the kernels give the same bits either way.
        """
        seqs, first = query_tiles(q_lens, tokens_per_tile)
        splits = self.splits_for(int(lengths.max(initial=1)), split)
        idle = len(seqs) * blocks_per_item < self.backend.profile.sm_count
        if self.split_policy == "always" or (self.split_policy == "auto" and splits > 1 and idle):
            return work_items(seqs, first, splits), splits
        return work_items(seqs, first, 0), 0

    def host_lengths(self, meta: AttentionMetadata) -> tuple[np.ndarray, np.ndarray]:
        """Query tokens and context length of every sequence on the host, read once per forward
        (`ForwardInputs`)."""
        inputs = self._forward_inputs(meta)
        return np.diff(inputs.host_starts), inputs.host_lengths

    def _forward_inputs(self, meta: AttentionMetadata) -> ForwardInputs:
        """The `ForwardInputs` of ``meta``'s forward: those of the last launch when it shares its device arrays of
        query starts and lengths, else read afresh."""
        inputs = self._forward
        if inputs is None or inputs.query_start_loc is not meta.query_start_loc or inputs.seq_lens is not meta.seq_lens:
            starts, lengths = self.cp.asnumpy(meta.query_start_loc), self.cp.asnumpy(meta.seq_lens)
            self._forward = inputs = ForwardInputs(meta.query_start_loc, meta.seq_lens, starts, lengths)
        return inputs


def mma_shared_bytes(steps: int, rows: int = MMA_ROWS) -> int:
    """attention_mma.cu's shared memory for heads padded to 16 x ``steps`` and items of ``rows`` query rows: two
    tiles' KV slots, the query rows and two key and value tiles in rows padded by 8, the rows' positions."""
    stride = 16 * steps + 8
    return 2 * MMA_TILE_N * 8 + (rows + 4 * MMA_TILE_N) * stride * 2 + 2 * rows * 4


def _kernel_args(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    meta: AttentionMetadata,
    work: Any,
    out: Any,
    scales: tuple[float, float],
    sliding_window: int | None,
    workspace: tuple[Any, ...] = (),
) -> tuple[Any, ...]:
    """The arguments of attention.cu's kernels (``workspace``: the split partials and the split count) and of
    attention_mma.cu's (none), in their order; ``scales``: the softmax scale (times the key scale of an fp8
    cache) and the value scale (1 for bf16 caches)."""
    _, block_size, kv_heads, d = k_cache.shape
    qs = [s // q.itemsize for s in q.strides]
    os_ = [s // out.itemsize for s in out.strides]
    q_vec = d % 8 == 0 and qs[0] % 8 == 0 and qs[1] % 8 == 0 and q.data.ptr % 16 == 0  # 16-byte row reads
    tables = meta.block_tables
    return (
        q,
        np.int64(qs[0]),
        np.int64(qs[1]),
        k_cache,
        v_cache,
        meta.query_start_loc,
        meta.seq_lens,
        tables,
        np.int32(tables.shape[1]),
        work,
        out,
        np.int64(os_[0]),
        np.int64(os_[1]),
        *workspace,
        np.int32(q.shape[1]),
        np.int32(kv_heads),
        np.int32(d),
        np.int32(block_size),
        np.float32(scales[0]),
        np.float32(scales[1]),
        np.int32(sliding_window or 0),
        np.int32(q_vec),
        np.uint64(0) if meta.visible_end is None else meta.visible_end,
    )
