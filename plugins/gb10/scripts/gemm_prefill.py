"""Time the cuda backend's dense products (``linear``) at prefill sizes beside the matrix peak.

    python3 plugins/gb10/scripts/gemm_prefill.py [--peak-tflops 790]

Prints per (rows x K x N) the microseconds per call under graph replay and the TFLOP/s reached, as a share
of ``--peak-tflops`` (the device's dense bf16 matrix peak; 790 for an H100 SXM through cuBLAS), for the
default path (`CudaBackend.prefill_gemm`'s kernel: gemm_wgmma.cu on Hopper, gemm_tiled.cu, where they pay),
each prefill kernel forced, and the batch-invariant path (gemm.cu).
"""

from __future__ import annotations

import argparse

import numpy as np
from atlas_gb10.backend import CudaBackend
from atlas_gb10.hardware import has_wgmma
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
FORCED = ("gemm_tiled", "gemm_wgmma")
"""Prefill kernels timed on their own beside the default (gemm_wgmma.cu's only where the device has wgmma)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peak-tflops", type=float, default=790.0)
    args = parser.parse_args()
    backend = CudaBackend()
    rng = np.random.default_rng(0)
    for k, n in SHAPES:
        w = backend.from_numpy(rng.standard_normal((n, k), dtype=np.float32) * k**-0.5, weight=True)
        for m in ROWS:
            x = backend.from_numpy(rng.standard_normal((m, k), dtype=np.float32))
            out = backend.cp.empty((m, n), dtype=x.dtype)
            flops = 2.0 * m * n * k
            line = f"{m:5d} x {k:5d} x {n:5d}"
            paths = {
                f"default ({backend.prefill_gemm(m, n, k) or 'gemm'})": lambda x=x, w=w, out=out: backend.linear(
                    x, w, out=out
                ),
                **{
                    name: lambda x=x, w=w, out=out, m=m, n=n, k=k, name=name: backend._prefill_gemm(
                        name, x, k, w, None, out, n, m, n, k
                    )
                    for name in FORCED
                    if name == "gemm_tiled" or has_wgmma(backend.profile.arch)
                },
                "invariant": lambda x=x, w=w, out=out: backend.linear(x, w, out=out),
            }
            for name, call in paths.items():
                backend.batch_invariant = name == "invariant"
                line += f"  {name} {rate(flops, time_call(call, iterations=20), args.peak_tflops)}"
            backend.batch_invariant = False
            print(line, flush=True)


if __name__ == "__main__":
    main()
