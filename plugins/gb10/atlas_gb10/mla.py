"""The ``mla`` op group on CUDA (kernels in ``kernels/mla.cu``).

* ``mla_head_linear``: one tensor-core product per head (``blockIdx.z``), each warp summing the whole K
  of its tile in a fixed order, so a token's result does not depend on how many tokens share the call.
  Decode-sized calls use one-m-tile warps (many warps streaming the weights), larger ones 32 x 32 warps.
* ``mla_write_latent``: a block per token copies ``[latent | k_rope]`` into its cache row (slot -1 skips).
* ``mla_attention``: the absorbed form over the paged latent cache on the tensor cores. A block holds
  16 (decode) or 32 (prefill) rows = (query token, head) pairs of one sequence and walks key tiles of
  ``MLA_TILE_N``; contexts are cut into splits of ``MLA_SPLIT`` keys, merged in order in the block
  (direct mode) or by ``mla_combine`` when the blocks would leave SMs idle (flash-decoding). The work
  list comes from the attention runner's machinery (`AttentionRunner.work_list`); captured decode
  graphs derive a static MLA plan from the graph's static attention plan, so nothing is read back,
  and all sizes depend only on the batch's shape. Splits are longer than dense attention's (a split's
  partial is ``heads x L`` floats, which for DeepSeek-V3 outweighs 64 keys of cache).

Prefill runs the same absorbed kernel (see docs/gpu.md: the expanded form saves FLOPs only against
a tensor-core dense attention kernel, `attention_mma.cu`, on which it is not written).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from atlas_core.backends.base import Array, AttentionMetadata
from atlas_core.backends.ops.mla import MLAOps
from atlas_gb10.arrays import BF16, element_strides, null_or
from atlas_gb10.backend import CudaBackend

LATENT_VARIANTS = (1, 2, 4, 8, 16)
"""Output n-tiles (8 latent columns) per warp of the attention kernels: latent widths up to 32 .. 512."""
ROWS_PER_M_TILE = 16


def written_into(result: Array, out: Array | None) -> Array:
    """The ``out=`` convention: ``result``, or ``out`` filled with it when the kernel could not write
    ``out`` directly (``result is out`` when it could)."""
    if out is None or result is out:
        return result
    out[...] = result
    return out


def mla_shared_bytes(m_tiles: int, buffers: int, width: int, tile_n: int, split: int) -> int:
    """Dynamic shared memory of ``mla_attention_m{m_tiles}_*`` for cache rows of ``width`` = L + R
    (the layout of ``mla_attention_body`` in mla.cu)."""
    rows, stride = ROWS_PER_M_TILE * m_tiles, ((width + 15) & ~15) + 8
    return (
        split * 8
        + rows * stride * 2
        + buffers * tile_n * stride * 2
        + rows * (tile_n + 8) * 2
        + rows * (tile_n + 1) * 4
        + 10 * rows * 4
    )


@dataclass(frozen=True)
class MLAPlan:
    """How one forward's `mla_attention` calls launch: the device work list of (sequence, first query
    token, split or -1, 0) items, its length, the split count (0: direct mode), m-tiles of 16 rows per
    block, and key-tile buffers (2: the next tile loads while one is computed)."""

    work: Any
    items: int
    splits: int
    m_tiles: int
    buffers: int


class CudaMLAOps(MLAOps):
    """`MLAOps` with every op a CUDA kernel; inputs and outputs stay on the device."""

    backend: CudaBackend

    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        self.cp = backend.cp
        self.runner = backend.attention_runner
        variant = backend.kernels.variant("mla")
        self.tile_n = variant.define("MLA_TILE_N", 64)
        self.split = variant.define("MLA_SPLIT", 256)
        self._eager: tuple[AttentionMetadata, tuple[int, int], MLAPlan] | None = None

    def _kernel(self, name: str) -> Any:
        return self.backend.kernels.function("mla", name)

    # ---- per-head products ----------------------------------------------------------------------
    def mla_head_linear(self, x: Array, weight: Array, out: Array | None = None) -> Array:
        backend, cp = self.backend, self.cp
        backend.require_bf16("mla_head_linear", x, weight, out)
        x, weight = backend.contiguous_rows(x), cp.ascontiguousarray(weight)
        tokens, heads, k = x.shape
        n = weight.shape[1]
        if tuple(weight.shape) != (heads, n, k):
            raise ValueError(
                f"mla_head_linear: weight {tuple(weight.shape)} does not match x {tuple(x.shape)} ([H, N, K])"
            )
        result = self._target(out, (tokens, heads, n))
        if tokens and n:
            xs, os_ = element_strides(x), element_strides(result)
            vec = (
                k % 8 == 0 and xs[0] % 8 == 0 and xs[1] % 8 == 0 and x.data.ptr % 16 == 0 and weight.data.ptr % 16 == 0
            )
            mt, nt = (1, 1) if tokens <= ROWS_PER_M_TILE else (2, 4)
            self._kernel(f"mla_head_linear_m{mt}_n{nt}_{'vec' if vec else 'any'}")(
                (math.ceil(n / (32 * nt)), math.ceil(tokens / (16 * mt)), heads),
                (128,),
                (
                    x,
                    np.int64(xs[0]),
                    np.int64(xs[1]),
                    weight,
                    result,
                    np.int64(os_[0]),
                    np.int64(os_[1]),
                    np.int32(tokens),
                    np.int32(n),
                    np.int32(k),
                ),
            )
        return written_into(result, out)

    def _target(self, out: Array | None, shape: tuple[int, ...]) -> Array:
        """Where a kernel writes its ``shape`` result: ``out`` when its last axis is contiguous, else new."""
        if out is not None and out.strides[-1] == out.itemsize:
            return out
        return self.cp.empty(shape, dtype=BF16)

    # ---- the latent cache -----------------------------------------------------------------------
    def mla_write_latent(self, cache: Array, latent: Array, k_rope: Array, slot_mapping: Array) -> None:
        self.backend.require_bf16("mla_write_latent", cache, latent, k_rope)
        tokens, width = latent.shape
        rope = k_rope.shape[1]
        if cache.shape[-1] != width + rope:
            raise ValueError(f"mla_write_latent: cache rows of {cache.shape[-1]} values, latent {width} + rope {rope}")
        if tokens == 0:
            return
        ls, rs = element_strides(latent), element_strides(k_rope)
        self._kernel("mla_write_latent_bf16")(
            (tokens,),
            (min(1024, 32 * math.ceil((width + rope) / 32)),),
            (
                cache,
                latent,
                np.int64(ls[0]),
                np.int64(ls[1]),
                k_rope,
                np.int64(rs[0]),
                np.int64(rs[1]),
                slot_mapping,
                np.int32(width),
                np.int32(rope),
            ),
        )

    # ---- attention ------------------------------------------------------------------------------
    def mla_attention(
        self,
        q_latent: Array,
        q_rope: Array,
        cache: Array,
        meta: AttentionMetadata,
        scale: float,
        row_scale: Array | None = None,
        out: Array | None = None,
    ) -> Array:
        backend = self.backend
        backend.require_bf16("mla_attention", q_latent, q_rope, cache, out)
        tokens, heads, latent = q_latent.shape
        width = latent + q_rope.shape[2]
        if cache.shape[-1] != width:
            raise ValueError(
                f"mla_attention: cache rows of {cache.shape[-1]} values, latent {latent} + rope {width - latent}"
            )
        nw = next((v for v in LATENT_VARIANTS if 32 * v >= latent), None)
        if nw is None or self._fitting_shape(width, 1) is None:  # wider than any kernel or the shared memory
            return super().mla_attention(q_latent, q_rope, cache, meta, scale, row_scale, out)
        q_latent, q_rope = backend.contiguous_rows(q_latent), backend.contiguous_rows(q_rope)
        result = self._target(out, (tokens, heads, latent))
        if tokens:
            self._launch(q_latent, q_rope, cache, meta, scale, row_scale, result, nw)
        return written_into(result, out)

    def _launch(
        self,
        q_latent: Array,
        q_rope: Array,
        cache: Array,
        meta: AttentionMetadata,
        scale: float,
        row_scale: Array | None,
        out: Array,
        nw: int,
    ) -> None:
        cp = self.cp
        tokens, heads, latent = q_latent.shape
        rope = q_rope.shape[2]
        block_size = cache.shape[1]
        plan = self._plan(meta, heads, latent + rope)
        splits = plan.splits
        hpt = min(heads, ROWS_PER_M_TILE * plan.m_tiles)
        smem = mla_shared_bytes(plan.m_tiles, plan.buffers, latent + rope, self.tile_n, self.split)
        kernel = self._kernel(f"mla_attention_m{plan.m_tiles}_n{nw}")
        if smem > 48 * 1024:
            kernel.max_dynamic_shared_size_bytes = smem
        rows = tokens * heads
        if splits:
            ws_acc = cp.empty((rows * splits * latent,), dtype=np.float32)
            ws_ml = cp.empty((rows * splits * 2,), dtype=np.float32)
        else:
            ws_acc = ws_ml = np.uint64(0)
        if row_scale is not None:
            row_scale = cp.ascontiguousarray(row_scale, dtype=np.float32)
        ql, qr, os_ = element_strides(q_latent), element_strides(q_rope), element_strides(out)
        tables = meta.block_tables
        kernel(
            (plan.items, math.ceil(heads / hpt)),
            (128 * plan.m_tiles,),
            (
                q_latent,
                np.int64(ql[0]),
                np.int64(ql[1]),
                q_rope,
                np.int64(qr[0]),
                np.int64(qr[1]),
                cache,
                meta.query_start_loc,
                meta.seq_lens,
                tables,
                np.int32(tables.shape[1]),
                plan.work,
                out,
                np.int64(os_[0]),
                np.int64(os_[1]),
                ws_acc,
                ws_ml,
                np.int32(max(splits, 1)),
                np.int32(heads),
                np.int32(hpt),
                np.int32(latent),
                np.int32(rope),
                np.int32(block_size),
                np.float32(scale),
                null_or(row_scale),
                np.int32(plan.buffers),
            ),
            shared_mem=smem,
        )
        if splits:
            self._kernel("mla_combine")(
                (math.ceil(rows / 4),),
                (128,),
                (
                    ws_acc,
                    ws_ml,
                    np.int32(splits),
                    out,
                    np.int64(os_[0]),
                    np.int64(os_[1]),
                    np.int32(heads),
                    np.int32(latent),
                    np.int64(rows),
                ),
            )

    def _fitting_shape(self, width: int, m_tiles: int) -> tuple[int, int] | None:
        """(m-tiles, key-tile buffers) within the device's shared memory: the requested m-tiles
        double-buffered if possible, then single-buffered, then one m-tile; None if nothing fits."""
        limit = self.backend.profile.shared_memory_per_block
        for mt, buffers in ((m_tiles, 2), (m_tiles, 1), (1, 2), (1, 1)):
            if mla_shared_bytes(mt, buffers, width, self.tile_n, self.split) <= limit:
                return mt, buffers
        return None

    def _plan(self, meta: AttentionMetadata, heads: int, width: int) -> MLAPlan:
        """This forward's plan (`mla_attention` has checked that one m-tile fits in shared memory).

        Captured decode graphs: derived once from the graph's static attention plan (same sequences,
        at least the same context coverage, in MLA splits), during the eager warm-up before capture,
        with 16-row blocks. Eager forwards: built from the sequences' lengths (read once per forward
        by the attention runner), 32-row blocks when a sequence has several query tokens; kept for
        the forward's other MLA layers."""
        runner = self.runner
        static = runner.static
        if static is not None and static.query_tokens != 1:
            raise NotImplementedError("MLA steps of several tokens per sequence are not captured (they run eagerly)")
        if static is not None:
            mt, buffers = self._fitting_shape(width, 1) or (1, 1)
            derived = static if static.splits == 0 else static.derived.get("mla")
            if derived is None:
                splits = runner.splits_for(static.splits * runner.split, self.split)
                derived = static.derived["mla"] = runner.static_work(static.num_seqs, splits)
            return MLAPlan(derived.work, int(derived.work.shape[0]), derived.splits, mt, buffers)
        key = (heads, width)
        if self._eager is not None and self._eager[0] is meta and self._eager[1] == key:
            return self._eager[2]
        q_lens, lengths = runner.host_lengths(meta)
        mt, buffers = self._fitting_shape(width, 1 if int(q_lens.max(initial=0)) <= 1 else 2) or (1, 1)
        hpt = min(heads, ROWS_PER_M_TILE * mt)
        work, splits = runner.work_list(
            q_lens, lengths, ROWS_PER_M_TILE * mt // hpt, math.ceil(heads / hpt), self.split
        )
        plan = MLAPlan(self.cp.asarray(work), len(work), splits, mt, buffers)
        self._eager = (meta, key, plan)
        return plan
