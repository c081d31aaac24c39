"""Time the cuda backend's dense products (``linear``) at decode sizes for each block tile, beside the
bandwidth ceiling: the weight bytes, read once.

    python3 plugins/gb10/scripts/gemm_tiles.py

Prints per (K x N, rows, tile): microseconds per call under graph replay, GB/s of weights, and the
percentage of the device's measured copy bandwidth. ``default`` is `CudaBackend.gemm_tile`'s choice;
``fp8`` the same product over the weight in FP8 E4M3 with 128 x 128 block scales (half the bytes), ``nvfp4`` in
NVFP4 (0.5625 bytes a weight), ``gguf_q8_0`` in llama.cpp's Q8_0 blocks (1.0625 bytes a weight).
"""

from __future__ import annotations

import cupy as cp
import numpy as np
from atlas_gb10.arrays import BF16
from atlas_gb10.backend import CudaBackend
from gguf import GGMLQuantizationType
from timing import copy_bandwidth, report, time_call

from atlas_core.weights.gguf_quantized import quantize as gguf_quantize
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
TILES: list[tuple[int, int] | str | None] = [None, (1, 1), (1, 2), (1, 4), "fp8", "nvfp4", "gguf_q8_0"]


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
            "gguf_q8_0": backend.upload_quantized(gguf_quantize(host_weight, GGMLQuantizationType.Q8_0)),
        }
        for m in (1, 4, 16):
            x = cp.asarray(rng.standard_normal((m, k), dtype=np.float32)).astype(BF16)
            for tile in TILES:
                fixed = tile if isinstance(tile, tuple) else None
                CudaBackend.gemm_tile = default_tile if fixed is None else (lambda self, m, n, t=fixed: t)  # type: ignore[method-assign]
                operand = quantized[tile] if isinstance(tile, str) else weight
                us = time_call(lambda: backend.linear(x, operand))  # noqa: B023 - timed at once, in this iteration
                label = tile if isinstance(tile, str) else "default" if tile is None else f"m{tile[0]} n{tile[1]}"
                report(f"K={k:6d} N={n:6d} M={m:3d} {label:8s}", us, operand.nbytes, peak)
    CudaBackend.gemm_tile = default_tile  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
