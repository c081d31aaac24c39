"""Speculative decoding on a repetitive workload: code editing, where the answer repeats most of the prompt.

Runs the same greedy chat requests with and without speculation and prints decode tokens/s of both, the
speed-up, the acceptance figures, and whether the outputs are identical (they must be).

    uv run python scripts/bench_speculative.py [MODEL] [--num-speculative-tokens K] [--backend NAME]
"""

from __future__ import annotations

import argparse
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
        llm = LLM(args.model, backend=args.backend, **extra)
        llm.chat(conversations[:1], SamplingParams(temperature=0, max_tokens=8))  # warm-up
        for conversation in conversations:  # one request at a time: batch-1 decode speed
            start = time.perf_counter()
            output = llm.chat([conversation], params, use_tqdm=False)[0]
            elapsed = time.perf_counter() - start
            tokens = output.outputs[0].token_ids
            results.setdefault(label, []).append((tokens, elapsed))
        stats = llm.engine.runner.spec_stats
        generated = sum(len(tokens) for tokens, _ in results[label])
        seconds = sum(elapsed for _, elapsed in results[label])
        print(f"{label:6} {generated} tokens in {seconds:.2f} s: {generated / seconds:.1f} tok/s (prefill included)")
        if llm.engine.speculation is not None:
            print(f"       {stats.describe()}")
    plain, spec = results["plain"], results["ngram"]
    same = all(a[0] == b[0] for a, b in zip(plain, spec, strict=True))
    speedup = sum(t for _, t in plain) / sum(t for _, t in spec)
    print(f"speed-up {speedup:.2f}x; outputs identical: {same}")


if __name__ == "__main__":
    main()
