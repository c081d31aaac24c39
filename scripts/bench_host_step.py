"""Host time per engine step: what the engine spends outside the model's forward at a large decode batch.

The offline-throughput ceiling of a fast device is set by the host once the forward takes a few
milliseconds: at 256 sequences, 12,000 output tok/s leaves 21 ms per step for everything. This runs
``--num-seqs`` sequences of one model to completion and times each phase of the steps where every
sequence decodes: the scheduler, building the batch (and preparing the next one), the forward and the
sampling kernel (the device's work on host backends; on backends that queue work, only their launches),
waiting for the device's results, giving the sequences their tokens, and the rest of the step (the engine's
bookkeeping and the outputs). It prints the median of each, in ms per step, and the output tok/s the host alone
would allow (every phase but the forward and the wait). On a backend that queues work, a decode step queued
ahead (`atlas_core.engine.ahead`) runs while the host keeps the books of the one before: the host's total and
the device's step then overlap, and the wait is what the host did not cover.

    python scripts/bench_host_step.py [MODEL] [--num-seqs 256] [--prompt-len 128] [--max-tokens 64]
        [--backend cuda] [--random-weights [--num-layers N]] [--kv-cache-memory-gib 0.5]

MODEL defaults to the tiny llama fixture (a forward of well under a millisecond per layer on the numpy
backend, so the host's share stands out); ``--backend cuda`` times the same phases on a device, and
``--random-weights`` takes MODEL as a preset of `atlas bench` (``qwen3-0.6b``: the offline throughput run's
shape) or a config.json path, with random weights.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from atlas_core import LLM, SamplingParams

TINY_LLAMA = Path(__file__).resolve().parents[1] / "plugins/models/llama/tests/fixtures/tiny/llama"
PHASES = ("schedule", "build_batch", "forward", "wait", "tokens", "rest")
HOST_PHASES = ("schedule", "build_batch", "tokens", "rest")


class PhaseTimer:
    """Wraps methods of live objects so that each call adds its wall time to the current step's phase."""

    def __init__(self) -> None:
        self.current: dict[str, float] = {}

    def wrap(self, owner: Any, method: str, phase: str) -> None:
        inner: Callable[..., Any] = getattr(owner, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.current[phase] = self.current.get(phase, 0.0) + time.perf_counter() - start

        setattr(owner, method, timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default=str(TINY_LLAMA))
    parser.add_argument("--backend", default="numpy")
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--random-weights", action="store_true", help="MODEL is a preset or a config.json path")
    parser.add_argument("--num-layers", type=int, default=None, help="with --random-weights: the first N layers")
    parser.add_argument("--kv-cache-memory-gib", type=float, default=0.5)
    args = parser.parse_args()

    engine_args = {"max_num_seqs": args.num_seqs, "kv_cache_memory_gib": args.kv_cache_memory_gib}
    if args.random_weights:
        from atlas_core.bench.random_weights import random_weights_llm

        llm = random_weights_llm(args.model, backend=args.backend, num_layers=args.num_layers, **engine_args)
    else:
        llm = LLM(args.model, backend=args.backend, **engine_args)
    engine = llm.engine
    vocab = engine.loaded.model.vocab_size
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=args.max_tokens, ignore_eos=True, seed=0)
    prompts = [rng.integers(0, vocab, args.prompt_len).tolist() for _ in range(args.num_seqs)]
    llm.generate([{"prompt_token_ids": p} for p in prompts[:2]], params)  # warm-up (kernels, graphs)

    timer = PhaseTimer()
    runner, backend = engine.runner, engine.backend
    timer.wrap(engine.scheduler, "schedule", "schedule")
    timer.wrap(runner, "build_batch", "build_batch")
    if runner.lookahead is not None:
        timer.wrap(runner.lookahead, "prepare", "build_batch")
    timer.wrap(runner, "_forward", "forward")
    if runner.ahead is not None:
        timer.wrap(runner.ahead, "forward", "forward")
    timer.wrap(backend, "sample", "forward")
    timer.wrap(backend, "to_numpy", "wait")
    start_download = backend.download_async

    def download_async(x: Any) -> Any:
        download = start_download(x)
        timer.wrap(download, "result", "wait")
        return download

    backend.download_async = download_async
    timer.wrap(runner, "_give_tokens", "tokens")
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", None, prompt, params)
    decode_steps: list[dict[str, float]] = []
    while engine.has_unfinished():
        timer.current = {}
        running = [s for s in engine.scheduler.running if s.is_decoding]
        full = len(running) == args.num_seqs and not engine.scheduler.waiting
        start = time.perf_counter()
        engine.step(finished_only=True)  # as `LLM.generate` steps it
        total = time.perf_counter() - start
        if full:
            phases = dict(timer.current)
            phases["rest"] = total - sum(phases.get(p, 0.0) for p in PHASES[:-1])
            decode_steps.append(phases)

    print(
        f"model {args.model} on {args.backend}: {args.num_seqs} sequences, prompt {args.prompt_len}, "
        f"{args.max_tokens} tokens each; {len(decode_steps)} steps with every sequence decoding"
    )
    medians = {p: 1000 * statistics.median(s.get(p, 0.0) for s in decode_steps) for p in PHASES}
    for phase in PHASES:
        print(f"  {phase:<12} {medians[phase]:8.2f} ms/step")
    host = sum(medians[p] for p in HOST_PHASES)
    step = statistics.median(sum(s.values()) for s in decode_steps) * 1000
    print(
        f"  host total   {host:8.2f} ms/step ({1000 * host / args.num_seqs:.1f} us per sequence): "
        f"the host alone allows {args.num_seqs / host * 1000:,.0f} output tok/s"
    )
    print(f"  whole step   {step:8.2f} ms/step: {args.num_seqs / step * 1000:,.0f} output tok/s")


if __name__ == "__main__":
    main()
