"""Time the cuda backend's dense products (``linear``) at prefill sizes beside the matrix peak.

    python3 plugins/gb10/scripts/gemm_prefill.py [--peak-tflops 790] [--rows 2048,8192] [--gated-only]

Prints per (rows x K x N) the microseconds per call under graph replay and the TFLOP/s reached, as a share
of ``--peak-tflops`` (the device's dense bf16 matrix peak; 790 for an H100 SXM through cuBLAS), for the
default path (`CudaBackend.prefill_gemm`'s kernel: gemm_wgmma.cu on Hopper, gemm_tiled.cu, where they pay),
each prefill kernel forced, and the batch-invariant path (gemm.cu). Then the feed-forwards' gated products
(`gated_linear`: on Hopper the product with its gate in the epilogue) beside the product followed by the
elementwise ``silu_mul``, N being the product's width (2 x the units).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import numpy as np
from atlas_gb10.backend import CudaBackend
from atlas_gb10.hardware import has_wgmma
from atlas_gb10.prefill_products import prefill_product
from timing import rate, time_call

SHAPES = [  # (K, N): the 4096-cubed product, Llama-3-8B q/k/v, o, gate/up, down; Qwen3-30B-A3B q/k/v;
    # Qwen3-0.6B q/k/v, o, gate/up, down
    (4096, 6144),
    (4096, 4096),
    (4096, 28672),
    (14336, 4096),
    (2048, 5120),
    (1024, 4096),
    (2048, 1024),
    (1024, 6144),
    (3072, 1024),
]
ROWS = (512, 2048, 4096, 8192)
GATED_SHAPES = [(4096, 28672), (1024, 6144)]  # (K, 2 x units): Llama-3-8B's and Qwen3-0.6B's gate/up
FORCED = ("gemm_tiled", "gemm_wgmma")
"""Prefill kernels timed on their own beside the default (gemm_wgmma.cu's only where the device has wgmma)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peak-tflops", type=float, default=790.0)
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated row counts")
    parser.add_argument("--gated-only", action="store_true", help="time only the gated products")
    args = parser.parse_args()
    backend = CudaBackend()
    rows = [int(r) for r in args.rows.split(",")]
    if not args.gated_only:
        time_products(backend, rows, args.peak_tflops)
    time_gated_products(backend, rows, args.peak_tflops)


def operands(
    backend: CudaBackend, shapes: list[tuple[int, int]], rows: list[int], seed: int
) -> Iterator[tuple[int, int, int, Any, Any]]:
    """``(m, k, n, x [m, k], w [n, k])`` of random bf16 operands for every (K, N) of ``shapes`` and every m."""
    rng = np.random.default_rng(seed)
    for k, n in shapes:
        w = backend.from_numpy(rng.standard_normal((n, k), dtype=np.float32) * k**-0.5, weight=True)
        for m in rows:
            yield m, k, n, backend.from_numpy(rng.standard_normal((m, k), dtype=np.float32)), w


def time_products(backend: CudaBackend, rows: list[int], peak_tflops: float) -> None:
    """One line per `SHAPES` product and row count: every path's time and rate."""
    for m, k, n, x, w in operands(backend, SHAPES, rows, seed=0):
        out = backend.cp.empty((m, n), dtype=x.dtype)
        flops = 2.0 * m * n * k
        line = f"{m:5d} x {k:5d} x {n:5d}"
        paths = {
            f"default ({backend.prefill_gemm(m, n, k) or 'gemm'})": lambda x=x, w=w, out=out: backend.linear(
                x, w, out=out
            ),
            **{
                name: lambda x=x, w=w, out=out, m=m, n=n, k=k, name=name: prefill_product(
                    backend, name, x, k, w, None, out, n, m, n, k
                )
                for name in FORCED
                if name == "gemm_tiled" or has_wgmma(backend.profile.arch)
            },
            "invariant": lambda x=x, w=w, out=out: backend.linear(x, w, out=out),
        }
        for name, call in paths.items():
            backend.batch_invariant = name == "invariant"
            line += f"  {name} {rate(flops, time_call(call, iterations=20), peak_tflops)}"
        backend.batch_invariant = False
        print(line, flush=True)


def time_gated_products(backend: CudaBackend, rows: list[int], peak_tflops: float) -> None:
    """One line per `GATED_SHAPES` product and row count: ``gated_linear`` beside ``linear`` then ``silu_mul``."""
    for m, k, n, x, w in operands(backend, GATED_SHAPES, rows, seed=1):
        flops = 2.0 * m * n * k
        fused = time_call(lambda x=x, w=w: backend.gated_linear(x, w, "silu"), iterations=20)
        unfused = time_call(lambda x=x, w=w: backend.silu_mul(backend.linear(x, w)), iterations=20)
        print(
            f"{m:5d} x {k:5d} x {n:5d} gated  gated_linear {rate(flops, fused, peak_tflops)}"
            f"  linear + silu_mul {rate(flops, unfused, peak_tflops)}",
            flush=True,
        )


if __name__ == "__main__":
    main()
