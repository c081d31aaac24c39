"""Speculative decoding on a repetitive workload: code editing, where the answer repeats most of the prompt.

Runs the same greedy chat requests with and without speculation and prints decode tokens/s of both, the
speed-up, the acceptance figures, and whether the outputs are identical (they must be).

    uv run python scripts/bench_speculative.py [MODEL] [--num-speculative-tokens K] [--backend NAME]
"""

from __future__ import annotations

import argparse
import gc
import time

from atlas_core import LLM, SamplingParams

SOURCE = """def moving_average(values, window):
    if window <= 0:
        raise ValueError("window must be positive")
    averages = []
    total = 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        if index >= window - 1:
            averages.append(total / window)
    return averages
"""

TASKS = [
    "Rename the function to rolling_mean and return the code.",
    "Rename the variable total to running_sum everywhere and return the whole code.",
    "Add type hints to the function signature and return the whole code.",
    "Return the same code with a docstring added.",
]


def release_device_memory() -> None:
    """Return a closed engine's device memory (CuPy's pool keeps freed blocks), so that the next engine's KV
    budget sees it free; nothing to do without CuPy."""
    gc.collect()
    try:
        import cupy
    except ImportError:
        return
    cupy.get_default_memory_pool().free_all_blocks()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=None, help="model (default: the built-in default model)")
    parser.add_argument("--num-speculative-tokens", type=int, default=4)
    parser.add_argument("--backend", default=None)
    parser.add_argument("--max-tokens", type=int, default=200)
    args = parser.parse_args()
    conversations = [[{"role": "user", "content": f"{task}\n\n```python\n{SOURCE}```"}] for task in TASKS]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    results = {}
    for label, extra in (("plain", {}), ("ngram", {"num_speculative_tokens": args.num_speculative_tokens})):
        with LLM(args.model, backend=args.backend, **extra) as llm:  # closed before the next one takes the memory
            for conversation in conversations:  # warm-up: kernels, and the graphs of every step shape the run takes
                llm.chat([conversation], params, use_tqdm=False)
            for conversation in conversations:  # one request at a time: batch-1 decode speed
                start = time.perf_counter()
                output = llm.chat([conversation], params, use_tqdm=False)[0]
                elapsed = time.perf_counter() - start
                tokens = output.outputs[0].token_ids
                results.setdefault(label, []).append((tokens, elapsed))
            stats = llm.engine.runner.spec_stats if llm.engine.speculation is not None else None
        del llm
        release_device_memory()
        generated = sum(len(tokens) for tokens, _ in results[label])
        seconds = sum(elapsed for _, elapsed in results[label])
        print(f"{label:6} {generated} tokens in {seconds:.2f} s: {generated / seconds:.1f} tok/s (prefill included)")
        if stats is not None:
            print(f"       {stats.describe()}")
    plain, spec = results["plain"], results["ngram"]
    same = all(a[0] == b[0] for a, b in zip(plain, spec, strict=True))
    speedup = sum(t for _, t in plain) / sum(t for _, t in spec)
    print(f"speed-up {speedup:.2f}x; outputs identical: {same}")


if __name__ == "__main__":
    main()
