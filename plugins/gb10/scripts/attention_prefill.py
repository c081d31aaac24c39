"""Time the cuda backend's prefill attention (``Backend.attention`` on a chunk of new tokens at the end of a long
context) beside the matrix peak.

    python3 plugins/gb10/scripts/attention_prefill.py [--peak-tflops 790] [--model qwen3-0.6b] [--context 8192]

Prints per (model shape, context, new tokens) the microseconds per call under graph replay and the TFLOP/s of the
causal attention's products (4 x head dim x query heads per visible key of each new token), as a share of
``--peak-tflops``, for the default kernel (attention_wgmma.cu on Hopper for 128-wide heads) and
attention_mma.cu's forced.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
from atlas_gb10.backend import CudaBackend
from timing import rate, time_call

from atlas_core.backends.base import AttentionMetadata

SHAPES = {  # query heads, KV heads, head dim
    "llama-3-8b": (32, 8, 128),
    "qwen3-0.6b": (16, 8, 128),
}
CHUNKS = [(8192, 2048), (2048, 2048), (32768, 2048)]
"""(context, new tokens): the last chunk of an 8k prompt, a 2k prompt, the last chunk of a 32k prompt."""
BLOCK_SIZE = 16


def causal_flops(context: int, new: int, q_heads: int, d: int) -> float:
    """The products' FLOPs of ``new`` tokens at the end of ``context`` (token i sees context - new + i + 1 keys)."""
    keys = new * (context - new) + new * (new + 1) / 2
    return 4.0 * d * q_heads * keys


def attention_call(
    backend: CudaBackend, rng: np.random.Generator, q_heads: int, kv_heads: int, d: int, context: int, new: int
) -> Callable[[], object]:
    """One attention call over random paged caches: ``new`` query tokens at the end of ``context`` keys."""
    blocks = -(-context // BLOCK_SIZE)
    meta = AttentionMetadata(
        backend.from_numpy(np.asarray([0, new], dtype=np.int32)),
        backend.from_numpy(np.asarray([context], dtype=np.int32)),
        backend.from_numpy(rng.permutation(blocks).astype(np.int32)[None, :]),
        backend.from_numpy(np.zeros(new, dtype=np.int32)),
    )
    shape = (blocks, BLOCK_SIZE, kv_heads, d)
    k_cache, v_cache = (backend.from_numpy(rng.standard_normal(shape, dtype=np.float32)) for _ in range(2))
    q = backend.from_numpy(rng.standard_normal((new, q_heads, d), dtype=np.float32))
    out = backend.cp.empty(q.shape, dtype=q.dtype)
    return lambda: backend.attention(q, k_cache, v_cache, meta, d**-0.5, out=out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peak-tflops", type=float, default=790.0)
    parser.add_argument("--model", choices=sorted(SHAPES), help="time this shape only")
    parser.add_argument("--context", type=int, help="time the chunks of this context only")
    args = parser.parse_args()
    backend = CudaBackend()
    runner = backend.attention_runner
    default = runner.wgmma_prefill
    rng = np.random.default_rng(0)
    for model, (q_heads, kv_heads, d) in SHAPES.items():
        for context, new in CHUNKS:
            if args.model not in (None, model) or args.context not in (None, context):
                continue
            call = attention_call(backend, rng, q_heads, kv_heads, d, context, new)
            flops = causal_flops(context, new, q_heads, d)
            line = f"{model:11} {context:6d} keys, {new:5d} new"
            for name, wgmma in (("default", default), ("attention_mma", False)):
                runner.wgmma_prefill = wgmma
                line += f" | {name} {rate(flops, time_call(call, 20), args.peak_tflops)}"
            runner.wgmma_prefill = default
            print(line, flush=True)


if __name__ == "__main__":
    main()
