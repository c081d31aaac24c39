"""Time the cuda backend's dense products (``linear``) at decode sizes for each block tile, beside the
bandwidth ceiling: the weight bytes, read once.

    python3 plugins/gb10/scripts/gemm_tiles.py

Prints per (K x N, rows, tile): microseconds per call under graph replay, GB/s of weights, and the
percentage of the device's measured copy bandwidth. ``default`` is `CudaBackend.gemm_tile`'s choice;
``fp8`` the same product over the weight in FP8 E4M3 with 128 x 128 block scales (half the bytes), ``nvfp4`` in
NVFP4 (0.5625 bytes a weight), ``gguf_*`` in llama.cpp's blocks (Q8_0: 1.0625 bytes a weight, Q4_0: 0.5625, Q4_K:
0.5625, Q6_K: 0.8203; K-quants from random blocks).
"""

from __future__ import annotations

import cupy as cp
import numpy as np
from atlas_gb10.arrays import BF16
from atlas_gb10.backend import CudaBackend
from gguf import GGMLQuantizationType
from timing import copy_bandwidth, report, time_call

from atlas_core.testing.gguf_blocks import gguf_blocks
from atlas_core.weights.nvfp4 import nvfp4_from_float
from atlas_core.weights.quantized import quantize_fp8

SHAPES = [  # (K, N): Qwen3-30B-A3B router, o_proj, q/k/v; Llama-3-8B q/k/v, gate/up, down
    (2048, 128),
    (4096, 2048),
    (2048, 5120),
    (4096, 6144),
    (4096, 28672),
    (14336, 4096),
]
GGUF_TYPES = (
    GGMLQuantizationType.Q8_0,
    GGMLQuantizationType.Q4_0,
    GGMLQuantizationType.Q4_K,
    GGMLQuantizationType.Q6_K,
)
TILES: list[tuple[int, int] | str | None] = [
    None,
    (1, 1),
    (1, 2),
    (1, 4),
    "fp8",
    "nvfp4",
    *(f"gguf_{qtype.name.lower()}" for qtype in GGUF_TYPES),
]


def main() -> None:
    backend = CudaBackend()
    peak = copy_bandwidth()
    print(f"device copy bandwidth {peak / 1e9:.0f} GB/s")
    rng = np.random.default_rng(0)
    default_tile = CudaBackend.gemm_tile
    for k, n in SHAPES:
        host_weight = rng.standard_normal((n, k), dtype=np.float32) * 0.02
        weight = cp.asarray(host_weight).astype(BF16)
        quantized = {
            "fp8": backend.upload_quantized(quantize_fp8(host_weight, (128, 128))),
            "nvfp4": backend.upload_quantized(nvfp4_from_float(host_weight)),
            **{
                f"gguf_{qtype.name.lower()}": backend.upload_quantized(gguf_blocks(rng, qtype, (n, k)))
                for qtype in GGUF_TYPES
            },
        }
        for m in (1, 4, 16):
            x = cp.asarray(rng.standard_normal((m, k), dtype=np.float32)).astype(BF16)
            for tile in TILES:
                fixed = tile if isinstance(tile, tuple) else None
                forced = default_tile if fixed is None else (lambda self, m, n, k, kind="bf16", t=fixed: t)
                CudaBackend.gemm_tile = forced  # type: ignore[method-assign]
                operand = quantized[tile] if isinstance(tile, str) else weight
                us = time_call(lambda: backend.linear(x, operand))  # noqa: B023 - timed at once, in this iteration
                label = tile if isinstance(tile, str) else "default" if tile is None else f"m{tile[0]} n{tile[1]}"
                report(f"K={k:6d} N={n:6d} M={m:3d} {label:8s}", us, operand.nbytes, peak)
    CudaBackend.gemm_tile = default_tile  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
