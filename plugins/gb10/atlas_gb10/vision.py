"""Core's ``vision`` op group on CUDA: GELU and LayerNorm as ``elementwise.cu`` kernels, and the full
attention within each image as the paged attention kernel over the patches themselves.

`segment_attention` sees the packed ``k`` / ``v`` ``[N, heads, D]`` as a KV cache of one-token blocks, each
image a sequence whose block table lists its own rows, and every query row's `AttentionMetadata.visible_end`
at its image's length: the causal kernel then attends to the whole image (the bidirectional-image path of
decoder attention), with its split-K and GQA machinery, no extra kernel.
"""

from __future__ import annotations

import numpy as np

from atlas_core.backends.base import Array, AttentionMetadata
from atlas_core.backends.ops.vision import VisionOps
from atlas_gb10.arrays import BF16
from atlas_gb10.backend import CudaBackend
from atlas_gb10.rowmap import as_rows, map_rows, row_stride

LN_THREADS = 256
"""Threads of ``layer_norm_bf16`` (one block per row; ``LN_THREADS`` in elementwise.cu)."""


class CudaVisionOps(VisionOps):
    """`VisionOps` as CUDA kernels (bf16 in and out, fp32 math); every op returns a new contiguous array."""

    backend: CudaBackend
    _segments: tuple[np.ndarray, AttentionMetadata] | None = None
    """The last encoder call's segments and their metadata (`_segments_meta`)."""

    def layer_norm(self, x: Array, weight: Array, bias: Array, eps: float) -> Array:
        backend = self.backend
        backend.require_bf16("layer_norm", x, weight, bias)
        cols = int(x.shape[-1])
        rows = as_rows(backend, x, cols)
        out = backend.cp.empty(x.shape, dtype=BF16)
        if rows.shape[0]:
            backend.kernels.function("elementwise", "layer_norm_bf16")(
                (rows.shape[0],),
                (LN_THREADS,),
                (rows, np.int64(row_stride(rows)), weight, bias, out, np.int32(cols), np.float32(eps)),
            )
        return out

    def gelu(self, x: Array, approximate: bool) -> Array:
        return map_rows(self.backend, "vision_gelu_tanh_bf16" if approximate else "vision_gelu_erf_bf16", x, None, 0.0)

    def segment_attention(self, q: Array, k: Array, v: Array, cu_seqlens: np.ndarray, scale: float) -> Array:
        backend = self.backend
        cp = backend.cp
        tokens, heads, head_dim = q.shape
        cache_shape = (tokens, 1, heads, head_dim)
        k_cache = cp.ascontiguousarray(k).reshape(cache_shape)
        v_cache = cp.ascontiguousarray(v).reshape(cache_shape)
        meta = self._segments_meta(cu_seqlens)
        return backend.attention(cp.ascontiguousarray(q), k_cache, v_cache, meta, scale)

    def _segments_meta(self, cu_seqlens: np.ndarray) -> AttentionMetadata:
        """The attention metadata of the segments ``cu_seqlens``; the same object for every layer of one
        encoder call (they share ``cu_seqlens``), so the runner reads its lengths back once per call."""
        cached = self._segments
        if cached is not None and cached[0] is cu_seqlens:
            return cached[1]
        cp = self.backend.cp
        starts = np.asarray(cu_seqlens, dtype=np.int64)
        lengths = np.diff(starts)
        width = max(int(lengths.max(initial=1)), 1)
        tables = np.full((len(lengths), width), -1, dtype=np.int32)
        for i, (start, length) in enumerate(zip(starts[:-1].tolist(), lengths.tolist(), strict=True)):
            tables[i, :length] = np.arange(start, start + length)
        meta = AttentionMetadata(
            query_start_loc=cp.asarray(starts.astype(np.int32)),
            seq_lens=cp.asarray(lengths.astype(np.int32)),
            block_tables=cp.asarray(tables),
            slot_mapping=cp.zeros(0, dtype=np.int32),
            visible_end=cp.asarray(np.repeat(lengths, lengths).astype(np.int32)),
        )
        self._segments = (cu_seqlens, meta)
        return meta
