"""Time the cuda backend's grouped expert products (``moe_experts``) at real models' expert shapes for
each tile shape, beside the bandwidth ceiling: the bytes of the experts the batch selects, read once.

    python3 plugins/gb10/scripts/moe_tiles.py

Prints per (shape, tokens, tiles): microseconds per call, GB/s of active expert weights, and the
percentage of the device's measured copy bandwidth. The tile choice of `CudaMoEOps._tiles` is what
decode and prefill use; the others are what it could use; ``fp8`` is the default tiles over the banks
in FP8 E4M3 with 128 x 128 block scales (half the bytes).
"""

from __future__ import annotations

import functools

import cupy as cp
import numpy as np
from atlas_gb10.arrays import BF16
from atlas_gb10.backend import CudaBackend
from atlas_gb10.moe import CudaMoEOps
from timing import copy_bandwidth, report, time_call

from atlas_core.backends.ops.moe import MoEOps
from atlas_core.weights.nvfp4 import nvfp4_from_float
from atlas_core.weights.quantized import quantize_fp8

SHAPES = {  # experts, top-k, hidden, expert width
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "qwen3-next-80b-a3b": (512, 10, 2048, 512),
}
TILES: list[tuple[int, int, int] | str | None] = [None, (1, 2, 2), (1, 4, 4), (1, 2, 4), (1, 4, 2), "fp8", "nvfp4"]


def main() -> None:
    backend = CudaBackend()
    moe = backend.ops(MoEOps)
    assert isinstance(moe, CudaMoEOps)
    peak = copy_bandwidth()
    print(f"device copy bandwidth {peak / 1e9:.0f} GB/s")
    rng = np.random.default_rng(0)
    default_tiles = CudaMoEOps._tiles
    for name, (experts, top_k, hidden, width) in SHAPES.items():
        host_in = rng.standard_normal((experts, 2 * width, hidden), dtype=np.float32) * 0.02
        host_out = rng.standard_normal((experts, hidden, width), dtype=np.float32) * 0.02
        w_in, w_out = cp.asarray(host_in).astype(BF16), cp.asarray(host_out).astype(BF16)
        quantized = {
            "fp8": [backend.upload_quantized(quantize_fp8(w, (128, 128))) for w in (host_in, host_out)],
            "nvfp4": [backend.upload_quantized(nvfp4_from_float(w)) for w in (host_in, host_out)],
        }
        for tokens in (1, 4, 16, 64):
            x = cp.asarray(rng.standard_normal((tokens, hidden), dtype=np.float32)).astype(w_in.dtype)
            ids = cp.asarray(np.stack([rng.choice(experts, top_k, replace=False) for _ in range(tokens)]), np.int32)
            weights = cp.full((tokens, top_k), 1.0 / top_k, dtype=np.float32)
            active = len(np.unique(cp.asnumpy(ids)))
            nbytes = active * 3 * width * hidden * 2
            for tiles in TILES:
                fixed = tiles if isinstance(tiles, tuple) else None
                CudaMoEOps._tiles = default_tiles if fixed is None else (lambda self, *a, t=fixed: t)  # type: ignore[method-assign]
                banks = quantized[tiles] if isinstance(tiles, str) else (w_in, w_out)
                us = time_call(functools.partial(moe.moe_experts, x, *banks, weights, ids, "silu"))
                label = (
                    tiles
                    if isinstance(tiles, str)
                    else "default"
                    if tiles is None
                    else f"m{tiles[0]} n{tiles[1]}/{tiles[2]}"
                )
                stored = sum(int(b.nbytes) for b in banks) / (w_in.nbytes + w_out.nbytes)  # bytes per bf16 byte
                report(f"{name:20s} T={tokens:3d} {label:12s}", us, int(nbytes * stored), peak)
        CudaMoEOps._tiles = default_tiles  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
