"""Where a batch-1 decode step's time goes on the cuda backend: graph replay (GPU) against the engine's
step (GPU + host), and each op at decode shapes with its achieved bandwidth.

Usage: python profile_decode.py [qwen3-0.6b|llama-3-8b ...]   (random weights; needs a CUDA GPU)
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time

import numpy as np
from timing import eager_ms

from atlas_core import SamplingParams
from atlas_core.bench.random_weights import PRESETS, random_weights_llm


def profile(name: str) -> None:
    llm = random_weights_llm(name, backend="cuda")
    backend, cp = llm.backend, llm.backend.cp
    config = PRESETS[name]
    prompt = np.random.default_rng(0).integers(0, config["vocab_size"], 32).tolist()
    params = SamplingParams(temperature=0, max_tokens=129, ignore_eos=True)
    llm.generate(prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    t0 = time.perf_counter()
    llm.generate(prompt, params)
    step_ms = (time.perf_counter() - t0) * 1e3 / 128
    profiler = cProfile.Profile()
    profiler.enable()
    llm.generate(prompt, params)
    profiler.disable()
    report = io.StringIO()
    pstats.Stats(profiler, stream=report).sort_stats("tottime").print_stats(18)
    print("\n".join(line[:160] for line in report.getvalue().splitlines()[6:30]))
    graphs = llm.engine.runner.decode_graphs
    graph = next(entry[0] for (size, _), entry in graphs.graphs.items() if size == 1)
    replay_ms = eager_ms(lambda: graph.launch())
    print(
        f"\n{name}: engine decode step {step_ms:.3f} ms, graph replay (GPU) {replay_ms:.3f} ms, "
        f"host share {step_ms - replay_ms:.3f} ms"
    )

    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    shapes = {
        "qkv": ((heads + 2 * kv_heads) * head_dim, hidden),
        "o": (hidden, heads * head_dim),
        "gate_up": (2 * inter, hidden),
        "down": (hidden, inter),
        "lm_head": (config["vocab_size"], hidden),
    }
    rng = np.random.default_rng(1)
    for label, (n, k) in shapes.items():
        w = cp.asarray(rng.standard_normal((n, k), dtype=np.float32)).astype(backend.activation_dtype)
        for tile in ((1, 1), (1, 2), (1, 4)):
            x = cp.asarray(rng.standard_normal((1, k), dtype=np.float32)).astype(backend.activation_dtype)
            backend.gemm_tile = lambda m, n, k, kind="bf16", tile=tile: tile
            ms = eager_ms(lambda x=x, w=w: backend.linear(x, w), repeats=200)
            del backend.gemm_tile
            print(
                f"  linear {label:8} M=1 N={n} K={k} forced tile {tile}: "
                f"{1e3 * ms:8.1f} us, {w.nbytes / ms / 1e6:7.1f} GB/s"
            )
        for m in (1, 8, 64, 256):
            x = cp.asarray(rng.standard_normal((m, k), dtype=np.float32)).astype(backend.activation_dtype)
            out = cp.empty((m, n), dtype=backend.activation_dtype)
            ms = eager_ms(lambda x=x, w=w, out=out: backend.linear(x, w, out=out))
            tile = backend.gemm_tile(m, n, k)
            print(
                f"  linear {label:8} M={m:<4} N={n:<7} K={k:<6} tile {tile}: {1e3 * ms:8.1f} us, "
                f"{w.nbytes / ms / 1e6:7.1f} GB/s, {2 * m * n * k / ms / 1e9:7.1f} TFLOP/s"
            )
    x = cp.asarray(rng.standard_normal((1, hidden), dtype=np.float32)).astype(backend.activation_dtype)
    wn = cp.ones((hidden,), dtype=backend.activation_dtype)
    print(f"  rms_norm [1, {hidden}] + residual: {1e3 * eager_ms(lambda: backend.rms_norm(x, wn, 1e-6, x)):.1f} us")
    gu = cp.asarray(rng.standard_normal((1, 2 * inter), dtype=np.float32)).astype(backend.activation_dtype)
    print(f"  silu_mul [1, {2 * inter}]: {1e3 * eager_ms(lambda: backend.silu_mul(gu)):.1f} us")
    kv = llm.engine.kv
    from atlas_core.backends.base import AttentionMetadata

    for context in (160, 1024, 8000):
        blocks = -(-context // kv.block_size)
        meta = AttentionMetadata(
            cp.asarray(np.array([0, 1], np.int32)),
            cp.asarray(np.array([context], np.int32)),
            cp.asarray(np.arange(blocks, dtype=np.int32)[None, :]),
            cp.asarray(np.array([0], np.int32)),
        )
        q = cp.asarray(rng.standard_normal((1, heads, head_dim), dtype=np.float32)).astype(backend.activation_dtype)
        runner = backend.attention_runner
        for policy in ("never", "always"):
            runner.split_policy = policy
            ms = eager_ms(lambda q=q, meta=meta: backend.attention(q, kv.keys[0], kv.values[0], meta, 0.1))
            print(f"  attention decode, context {context}, split {policy}: {1e3 * ms:.1f} us")
        runner.split_policy = "auto"


if __name__ == "__main__":
    for model in sys.argv[1:] or ["qwen3-0.6b"]:
        profile(model)
