"""Time the cuda backend's dense products (``linear``) at decode sizes for each block tile, beside the
bandwidth ceiling: the weight bytes, read once.

    python3 plugins/gb10/scripts/gemm_tiles.py

Prints per (K x N, rows, tile): microseconds per call under graph replay (one product after another over
distinct copies of the weight, at least 160 MB of them, so that no weight comes from L2, as programmatic launches
like a decode graph's), GB/s of weights, and the percentage of the device's measured copy bandwidth. ``default``
is `CudaBackend.gemm_tile`'s choice; ``fp8`` the same product over the weight in FP8 E4M3 with 128 x 128 block
scales (half the bytes), ``nvfp4`` in NVFP4 (0.5625 bytes a weight), ``gguf_*`` in llama.cpp's blocks (Q8_0: 1.0625
bytes a weight, Q4_0: 0.5625, Q4_K: 0.5625, Q6_K: 0.8203; K-quants from random blocks).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import cupy as cp
import numpy as np
from atlas_gb10.arrays import BF16
from atlas_gb10.backend import CudaBackend
from gguf import GGMLQuantizationType
from timing import copy_bandwidth, report, time_rotating

from atlas_core.testing.gguf_blocks import gguf_blocks
from atlas_core.weights.nvfp4 import nvfp4_from_float
from atlas_core.weights.quantized import quantize_fp8

SHAPES = [  # (K, N): Qwen3-0.6B q/k/v, gate/up, o_proj, down; Qwen3-30B-A3B router, o_proj, q/k/v; Llama-3-8B
    (1024, 4096),  # q/k/v, gate/up, down
    (1024, 6144),
    (2048, 1024),
    (3072, 1024),
    (2048, 128),
    (4096, 2048),
    (2048, 5120),
    (4096, 6144),
    (4096, 28672),
    (14336, 4096),
]
ROTATED_BYTES = 160e6
"""Each product is timed over distinct copies of its weight totalling at least this much (over the L2's size)."""
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


def rotated(upload: Callable[[], Any]) -> list[Any]:
    """Distinct device copies of a weight (``upload()`` each), at least `ROTATED_BYTES` of them."""
    first = upload()
    return [first, *(upload() for _ in range(math.ceil(ROTATED_BYTES / first.nbytes) - 1))]


def main() -> None:
    backend = CudaBackend()
    peak = copy_bandwidth()
    print(f"device copy bandwidth {peak / 1e9:.0f} GB/s")
    rng = np.random.default_rng(0)
    default_tile = CudaBackend.gemm_tile
    for k, n in SHAPES:
        host_weight = rng.standard_normal((n, k), dtype=np.float32) * 0.02
        fp8, nvfp4 = quantize_fp8(host_weight, (128, 128)), nvfp4_from_float(host_weight)
        blocks = {qtype: gguf_blocks(rng, qtype, (n, k)) for qtype in GGUF_TYPES}
        operands = {
            "bf16": rotated(lambda: cp.asarray(host_weight).astype(BF16)),  # noqa: B023 - used in this iteration
            "fp8": rotated(lambda: backend.upload_quantized(fp8)),  # noqa: B023
            "nvfp4": rotated(lambda: backend.upload_quantized(nvfp4)),  # noqa: B023
            **{
                f"gguf_{qtype.name.lower()}": rotated(lambda b=b: backend.upload_quantized(b))
                for qtype, b in blocks.items()
            },
        }
        for m in (1, 4, 16):
            x = cp.asarray(rng.standard_normal((m, k), dtype=np.float32)).astype(BF16)
            for tile in TILES:
                fixed = tile if isinstance(tile, tuple) else None
                forced = default_tile if fixed is None else (lambda self, m, n, k, kind="bf16", t=fixed: t)
                CudaBackend.gemm_tile = forced  # type: ignore[method-assign]
                copies = operands[tile if isinstance(tile, str) else "bf16"]
                us = time_rotating([functools.partial(backend.linear, x, w) for w in copies], backend)
                label = tile if isinstance(tile, str) else "default" if tile is None else f"m{tile[0]} n{tile[1]}"
                report(f"K={k:6d} N={n:6d} M={m:3d} {label:8s}", us, copies[0].nbytes, peak)
    CudaBackend.gemm_tile = default_tile  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
