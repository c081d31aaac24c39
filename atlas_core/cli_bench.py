"""``atlas bench``: batch-1 decode speed beside its memory-bandwidth roofline.

The roofline of batch-1 decode is ``bandwidth / bytes read per token``: every weight is read
once per token (KV reads are small at short context). Bandwidth is measured here, as the
throughput of a large array copy on the backend (read + write bytes / time).
"""

from __future__ import annotations

import argparse
import platform
import time
from typing import Any

import numpy as np

from atlas_core.cli import add_engine_args, engine_kwargs
from atlas_core.engine.sampling_params import SamplingParams


def measure_copy_bandwidth(backend: Any, megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes per second of ``dst[...] = src`` for a ``megabytes`` array (best of ``repeats``)."""
    src = backend.from_numpy(np.ones(megabytes * 2**20 // 4, dtype=np.float32))
    dst = backend.zeros(src.shape, src.dtype)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst[...] = src
        backend.to_numpy(dst[:1])
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best


def weight_bytes(model: Any) -> int:
    """Bytes of every distinct weight array reachable from the model (each counted once)."""
    seen: dict[int, int] = {}

    def walk(value: Any, depth: int = 0) -> None:
        if hasattr(value, "nbytes") and hasattr(value, "shape"):
            seen[id(value)] = int(value.nbytes)
        elif depth < 6 and isinstance(value, (list, tuple)):
            for item in value:
                walk(item, depth + 1)
        elif depth < 6 and hasattr(value, "__dict__"):
            for item in vars(value).values():
                walk(item, depth + 1)

    walk(model)
    return sum(seen.values())


def run_bench(args: argparse.Namespace) -> int:
    from atlas_core.engine.llm import LLM

    llm = LLM(args.model, **engine_kwargs(args))
    model = llm.loaded.model
    prompt = list(range(1, args.prompt_len + 1))
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    llm.generate(prompt, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))  # warm-up
    start = time.perf_counter()
    llm.generate(prompt, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    prefill_time = time.perf_counter() - start
    start = time.perf_counter()
    output = llm.generate(prompt, params)[0]
    elapsed = time.perf_counter() - start - prefill_time
    decoded = len(output.outputs[0].token_ids) - 1
    rate = decoded / elapsed
    embed_bytes = int(model.embed_tokens.nbytes)
    # Per token, decode reads every weight except the embedding table (one row is gathered);
    # tied embeddings are still read in full by the lm_head.
    read_bytes = weight_bytes(model) - (embed_bytes if model.lm_head is not model.embed_tokens else 0)
    bandwidth = measure_copy_bandwidth(llm.backend)
    ceiling = bandwidth / read_bytes
    print(f"model        {llm.loaded.name} ({read_bytes / 1e6:.1f} MB of weights read per token)")
    print(f"backend      {llm.backend.name} on {platform.machine()} ({platform.processor() or 'cpu'})")
    print(f"bandwidth    {bandwidth / 1e9:.1f} GB/s (measured array copy)")
    print(f"decode       {rate:.1f} tok/s at batch 1, prompt {args.prompt_len}, {decoded} tokens")
    print(f"roofline     {ceiling:.1f} tok/s -> {100 * rate / ceiling:.0f}% of roofline, {rate * read_bytes / 1e9:.1f} GB/s achieved")
    return 0


def add_bench_parser(commands: Any) -> None:
    parser = commands.add_parser("bench", help="measure batch-1 decode speed against the bandwidth roofline")
    add_engine_args(parser)
    parser.add_argument("--tokens", type=int, default=128, help="tokens to decode (default: 128)")
    parser.add_argument("--prompt-len", type=int, default=32, help="prompt length in tokens (default: 32)")
    parser.set_defaults(handler=run_bench)
