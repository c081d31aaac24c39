"""Time the cuda backend's dense products (``linear``) at decode sizes for each block tile, beside the
bandwidth ceiling: the weight bytes, read once.

    python3 plugins/gb10/scripts/gemm_tiles.py [--kinds bf16,fp8,...] [--rows 1,4,16] [--shapes 4096x28672,...]

Prints per (K x N, rows, weight kind, tile): microseconds per call under graph replay (one product after another
over distinct copies of the weight, at least 160 MB of them, so that no weight comes from L2, as programmatic
launches like a decode graph's), GB/s of weights, and the percentage of the device's measured copy bandwidth.
``default`` is `CudaBackend.gemm_tile`'s choice, ``m1 n2`` a tile forced. The kinds: ``bf16``; ``fp8``, the same
product over the weight in FP8 E4M3 with 128 x 128 block scales (half the bytes); ``nvfp4`` in NVFP4 (0.5625 bytes a
weight); ``gguf_*`` in llama.cpp's blocks (Q8_0: 1.0625 bytes a weight, Q4_0: 0.5625, Q4_K: 0.5625, Q6_K: 0.8203;
K-quants from random blocks).
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable
from typing import Any

import cupy as cp
import numpy as np
from atlas_gb10.arrays import BF16
from atlas_gb10.backend import CudaBackend
from atlas_gb10.quantized_weights import LOW8_ROWS
from gguf import GGMLQuantizationType
from timing import copy_bandwidth, report, time_rotating

from atlas_core.weights.gguf_quantized import random_gguf_weight
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
KINDS = ("bf16", "fp8", "nvfp4", *(f"gguf_{qtype.name.lower()}" for qtype in GGUF_TYPES))
TILES: list[tuple[int, int] | None] = [None, (1, 1), (1, 2), (1, 4)]
"""The tiles timed (None: the backend's choice); quantized products of at most 8 rows have no (1, 4) kernel."""


def rotated(upload: Callable[[], Any]) -> list[Any]:
    """Distinct device copies of a weight (``upload()`` each), at least `ROTATED_BYTES` of them."""
    first = upload()
    return [first, *(upload() for _ in range(math.ceil(ROTATED_BYTES / first.nbytes) - 1))]


def quantized(kind: str, weight: np.ndarray, rng: np.random.Generator) -> Any:
    """The host weight of ``kind`` for the float32 ``weight`` (random blocks of its shape for the K-quants)."""
    if kind == "bf16":
        return weight
    if kind == "fp8":
        return quantize_fp8(weight, (128, 128))
    if kind == "nvfp4":
        return nvfp4_from_float(weight)
    return random_gguf_weight(rng, GGMLQuantizationType[kind.removeprefix("gguf_").upper()], weight.shape)


def upload(backend: CudaBackend, weight: Any) -> Any:
    """A device copy of a `quantized` weight."""
    if isinstance(weight, np.ndarray):
        return cp.asarray(weight).astype(BF16)
    return backend.upload_quantized(weight)


def tiles_of(kind: str, m: int) -> list[tuple[int, int] | None]:
    """The tiles gemm.cu has for products of ``m`` rows over weights of ``kind``."""
    return [t for t in TILES if not (kind != "bf16" and m <= LOW8_ROWS and t == (1, 4))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", default=",".join(KINDS), help="weight kinds, comma-separated")
    parser.add_argument("--rows", default="1,4,16", help="product rows (M), comma-separated")
    parser.add_argument("--shapes", default=None, help="K x N shapes such as 4096x28672, comma-separated")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    shapes = SHAPES if args.shapes is None else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    backend = CudaBackend()
    peak = copy_bandwidth()
    print(f"device copy bandwidth {peak / 1e9:.0f} GB/s")
    rng = np.random.default_rng(0)
    default_tile = CudaBackend.gemm_tile
    for k, n in shapes:
        host_weight = rng.standard_normal((n, k), dtype=np.float32) * 0.02
        operands = {
            kind: rotated(functools.partial(upload, backend, quantized(kind, host_weight, rng))) for kind in kinds
        }
        for m in (int(v) for v in args.rows.split(",")):
            x = cp.asarray(rng.standard_normal((m, k), dtype=np.float32)).astype(BF16)
            for kind in kinds:
                for tile in tiles_of(kind, m):
                    forced = default_tile if tile is None else (lambda self, m, n, k, kind="bf16", t=tile: t)
                    CudaBackend.gemm_tile = forced  # type: ignore[method-assign]
                    copies = operands[kind]
                    us = time_rotating([functools.partial(backend.linear, x, w) for w in copies], backend)
                    label = "default" if tile is None else f"m{tile[0]} n{tile[1]}"
                    report(f"K={k:6d} N={n:6d} M={m:3d} {kind:11s} {label:8s}", us, copies[0].nbytes, peak)
    CudaBackend.gemm_tile = default_tile  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
