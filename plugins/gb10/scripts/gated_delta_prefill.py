"""Time the cuda backend's gated delta rule over one prefill call at the Qwen3.5 / Qwen3-Next head sizes (16 key
heads and 32 value heads of 128), in the recurrent form (the batch-invariant mode) and the chunked one, beside
the chunked form's ceiling: its products' FLOPs at the tensor cores' peak.

    python3 plugins/gb10/scripts/gated_delta_prefill.py [--tokens 1024 8192] [--sequences 1 8] [--peak-gflops 790000]

Prints per (tokens, sequences, form): milliseconds per call and, for the chunked form, the share of the ceiling.
The calls run eagerly (the chunked form is not used under graph capture); 2 warm-up calls, then the mean of 5.
"""

from __future__ import annotations

import argparse
import functools

import cupy as cp
import numpy as np
from atlas_gb10.backend import CudaBackend
from timing import eager_ms

from atlas_core.backends.ops.gated_delta import GatedDeltaOps

KEY_HEADS, VALUE_HEADS, HEAD_DIM, CHUNK = 16, 32, 128, 64


def chunked_flops(tokens: int) -> float:
    """FLOPs of the chunked form's products over ``tokens`` tokens (per chunk and value head: k kᵀ and q kᵀ,
    W and U, W S and q S, P delta, the state update)."""
    d = HEAD_DIM
    per_chunk = 2 * (
        2 * CHUNK * CHUNK * d + 2 * CHUNK * CHUNK * d + 2 * CHUNK * d * d + CHUNK * CHUNK * d + CHUNK * d * d
    )
    return per_chunk * (tokens / CHUNK) * VALUE_HEADS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 8192])
    parser.add_argument("--sequences", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--peak-gflops", type=float, default=790_000.0)
    args = parser.parse_args()
    backend = CudaBackend()
    ops = backend.ops(GatedDeltaOps)
    rng = np.random.default_rng(0)
    for tokens in args.tokens:
        width = (2 * KEY_HEADS + VALUE_HEADS) * HEAD_DIM
        mixed = backend.from_numpy(rng.standard_normal((tokens, width), dtype=np.float32))
        qk = KEY_HEADS * HEAD_DIM
        q = mixed[:, :qk].reshape(tokens, KEY_HEADS, HEAD_DIM)
        k = mixed[:, qk : 2 * qk].reshape(tokens, KEY_HEADS, HEAD_DIM)
        v = mixed[:, 2 * qk :].reshape(tokens, VALUE_HEADS, HEAD_DIM)
        g = cp.asarray(-rng.uniform(0.0, 1.0, (tokens, VALUE_HEADS)), dtype=np.float32)
        beta = cp.asarray(rng.uniform(0.0, 1.0, (tokens, VALUE_HEADS)), dtype=np.float32)
        inputs = (q, k, v, g, beta)
        for sequences in args.sequences:
            state = cp.zeros((sequences, VALUE_HEADS, HEAD_DIM, HEAD_DIM), dtype=np.float32)
            starts = cp.asarray(np.linspace(0, tokens, sequences + 1).astype(np.int32))
            slots = cp.arange(sequences, dtype=np.int32)
            for form in ("recurrent", "chunked"):
                backend.batch_invariant = form == "recurrent"
                call = functools.partial(ops.gated_delta_rule, *inputs, state, starts, slots, scale=HEAD_DIM**-0.5)
                ms = eager_ms(call, repeats=5, warmup=2)
                line = f"{tokens:6d} tokens, {sequences} sequences, {form:9}: {ms:8.3f} ms"
                if form == "chunked":
                    tflops = chunked_flops(tokens) / (ms / 1e3) / 1e12
                    line += f"  {tflops:6.1f} TFLOP/s ({100 * tflops * 1e3 / args.peak_gflops:.1f}% of peak)"
                print(line, flush=True)
    backend.batch_invariant = False


if __name__ == "__main__":
    main()
