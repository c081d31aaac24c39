"""The tensor-core decode attention (attention_decode.cu): which launches of 16-row work items take it, and its
shared memory. Outside the batch-invariant mode it replaces attention.cu's 16-row kernels (decode tokens,
small verify steps) for head dims of 64, 128 and 256, with the same work items, workspace and combine."""

from __future__ import annotations

from typing import Any

DECODE_HEAD_STEPS = (4, 8, 16)
"""Head dims 16 x these (64, 128, 256) have a tensor-core decode kernel (``attention_decode_d{steps}``)."""
DECODE_SPLIT = 64
"""attention_decode.cu's keys a split (``DEC_KEYS``): the kernel takes attention.cu's work items only where
those split the context the same way."""
_ROWS, _WARPS = 16, 4


def decode_shared_bytes(steps: int, dtype: str) -> int:
    """attention_decode.cu's shared memory for heads of 16 x ``steps`` over ``dtype`` caches: a split's KV
    slots, the per-warp and per-row statistics and the rows' positions, the query rows and one key and value
    tile in rows padded by 8 (fp8 caches also stage the tile's bytes)."""
    stride = 16 * steps + 8
    statistics = (3 * _WARPS * _ROWS + 4 * _ROWS + 2 * _ROWS) * 4
    tiles = (_ROWS + 2 * DECODE_SPLIT) * stride * 2
    staging = 2 * DECODE_SPLIT * stride if dtype == "fp8" else 0
    return DECODE_SPLIT * 8 + statistics + tiles + staging


def decode_kernel(backend: Any, head_dim: int, split: int, dtype: str) -> tuple[Any, int] | None:
    """(kernel, shared bytes) of attention_decode.cu for 16-row work items over ``head_dim``-wide heads and
    ``dtype`` caches cut into splits of ``split`` keys, or None where attention.cu's kernels run them: the
    batch-invariant mode, other head dims or splits, or too little shared memory per block."""
    steps = head_dim // 16
    if backend.batch_invariant or head_dim % 16 or steps not in DECODE_HEAD_STEPS or split != DECODE_SPLIT:
        return None
    smem = decode_shared_bytes(steps, dtype)
    if smem > backend.profile.shared_memory_per_block:
        return None
    kernel = backend.kernels.function("attention_decode", f"attention_decode_d{steps}", dtype)
    if smem > 48 * 1024:
        kernel.max_dynamic_shared_size_bytes = smem
    return kernel, smem
