"""Time the cuda backend's dense products (``linear``) at prefill sizes beside the matrix peak.

    python3 plugins/gb10/scripts/gemm_prefill.py [--peak-tflops 790]

Prints per (rows x K x N) the microseconds per call under graph replay and the TFLOP/s reached, as a share
of ``--peak-tflops`` (the device's dense bf16 matrix peak; 790 for an H100 SXM through cuBLAS), for the
default path (gemm_tiled.cu where it pays) and the batch-invariant one (gemm.cu).
"""

from __future__ import annotations

import argparse

import numpy as np
from atlas_gb10.backend import CudaBackend
from timing import time_call

SHAPES = [  # (K, N): Llama-3-8B q/k/v, o, gate/up, down; Qwen3-30B-A3B q/k/v
    (4096, 6144),
    (4096, 4096),
    (4096, 28672),
    (14336, 4096),
    (2048, 5120),
]
ROWS = (512, 2048, 8192)


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
            for invariant in (False, True):
                backend.batch_invariant = invariant
                us = time_call(lambda x=x, w=w, out=out: backend.linear(x, w, out=out), iterations=20)
                tflops = flops / us / 1e6
                name = "invariant" if invariant else "default"
                line += f"  {name} {us:9.1f} us {tflops:6.1f} TFLOP/s ({100 * tflops / args.peak_tflops:4.1f}%)"
            backend.batch_invariant = False
            print(line, flush=True)


if __name__ == "__main__":
    main()
