"""``atlas bench throughput``: the offline workload nano-vllm and mini-sglang publish.

``--num-requests`` requests (256), each with an input and an output length drawn uniformly from
[``--min-len``, ``--max-len``] ([100, 1024]), random token ids, ``ignore_eos`` so every request
generates exactly its output length, all submitted at once through `LLM.generate`.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from atlas_core.bench.header import ceilings, print_header
from atlas_core.bench.roofline import WeightTraffic, weight_traffic
from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.errors import InvalidRequestError


@dataclass
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]
    min_len: int
    max_len: int  # after clamping
    clamped: bool

    @property
    def input_tokens(self) -> int:
        return sum(len(prompt) for prompt in self.prompts)

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)


def make_workload(
    num_requests: int, min_len: int, max_len: int, seed: int, vocab_size: int, max_seq_len: int
) -> Workload:
    """Draw the requests. Lengths are clamped to ``max_seq_len // 2`` so prompt + output fits."""
    if num_requests < 1 or min_len < 1 or max_len < min_len:
        raise InvalidRequestError(
            f"need --num-requests >= 1 and 1 <= --min-len <= --max-len, got {num_requests}, {min_len}, {max_len}"
        )
    limit = max_seq_len // 2
    top = min(max_len, limit)
    bottom = min(min_len, top)
    rng = np.random.default_rng(seed)
    input_lens = rng.integers(bottom, top + 1, size=num_requests)
    output_lens = rng.integers(bottom, top + 1, size=num_requests)
    prompts = [rng.integers(0, vocab_size, size=int(n)).tolist() for n in input_lens]
    return Workload(prompts, [int(n) for n in output_lens], bottom, top, clamped=(top, bottom) != (max_len, min_len))


def ceiling_time(
    workload: Workload, traffic: WeightTraffic, bandwidth: float, peak: float, config: Any
) -> tuple[float, float, int]:
    """(compute seconds, weight-read seconds, fewest forward steps) the workload needs at best.

    Steps: a request needs its prefill chunks then one step per further output token; a step
    holds at most ``max_num_batched_tokens`` tokens and samples at most ``max_num_seqs`` rows.
    """
    n = len(workload.prompts)
    body_tokens = workload.input_tokens + workload.output_tokens - n  # the last sampled token is never fed back
    compute = traffic.flops(body_tokens, workload.output_tokens) / peak
    budget = config.max_num_batched_tokens
    chunk = min(budget, getattr(config, "max_prefill_tokens", None) or budget)
    sequential = max(
        -(-len(p) // chunk) + out - 1 for p, out in zip(workload.prompts, workload.output_lens, strict=True)
    )
    steps = max(sequential, -(-body_tokens // budget), -(-workload.output_tokens // config.max_num_seqs))
    return compute, steps * traffic.bytes_per_step / bandwidth, steps


def seconds(value: float) -> str:
    return f"{value:.3f} s" if value >= 1 else f"{1e3 * value:.3f} ms"


def run_throughput(args: argparse.Namespace) -> int:
    from atlas_core.bench.cli import make_llm

    with make_llm(args) as llm:  # a split model's ranks stop with it
        return measure_throughput(args, llm)


def measure_throughput(args: argparse.Namespace, llm: Any) -> int:
    """Run the offline workload of ``args`` on ``llm`` and print its figures beside the ceilings."""
    engine = llm.engine
    workload = make_workload(
        args.num_requests, args.min_len, args.max_len, args.seed, llm.loaded.model.vocab_size, engine.max_seq_len
    )
    traffic = weight_traffic(llm.loaded.model, llm.engine.kv_layouts)
    print_header("throughput", llm, traffic)
    bandwidth, peak = ceilings(args, llm.backend)
    print(
        f"workload      {len(workload.prompts)} requests, "
        f"input and output lengths uniform in [{workload.min_len}, {workload.max_len}], seed {args.seed}, "
        f"token ids uniform in [0, {llm.loaded.model.vocab_size}), temperature {args.temperature:g}, ignore_eos"
    )
    if workload.clamped:
        print(
            f"clamped       --min-len/--max-len {args.min_len}/{args.max_len} -> {workload.min_len}/{workload.max_len} "
            f"so that prompt + output <= max_seq_len {engine.max_seq_len}"
        )
    params = [
        SamplingParams(
            max_tokens=out,
            temperature=args.temperature,
            ignore_eos=True,
            seed=None if args.temperature == 0 else args.seed + i,
        )
        for i, out in enumerate(workload.output_lens)
    ]
    # Warm-up on prompts of its own, so that no block of the workload is in the prefix cache.
    warm = np.random.default_rng(args.seed + 1).integers(0, llm.loaded.model.vocab_size, size=(2, 24)).tolist()
    llm.generate(warm, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    scheduler: Any = getattr(engine, "scheduler", None)  # engines without one report no preemptions
    preempted_before = getattr(scheduler, "num_preemptions", None)
    steps_before, ahead_before = getattr(engine, "num_steps", None), _queued_ahead(engine)
    start = time.perf_counter()
    outputs = llm.generate(workload.prompts, params, use_tqdm=args.progress)
    elapsed = time.perf_counter() - start
    generated = sum(len(output.outputs[0].token_ids) for output in outputs)
    total = workload.input_tokens + generated
    print(
        f"tokens        input {workload.input_tokens}, output {generated} "
        f"(requested {workload.output_tokens}), total {total}"
    )
    print(f"time          {elapsed:.3f} s")
    print(
        f"throughput    {generated / elapsed:.1f} output tok/s, {total / elapsed:.1f} total tok/s, "
        f"{len(outputs) / elapsed:.2f} req/s"
    )
    if steps_before is not None:
        queued = _queued_ahead(engine) - ahead_before
        print(
            f"steps         {engine.num_steps - steps_before} forward steps, {queued} of them launched before the "
            "tokens of the step before were read (atlas_core/engine/ahead.py)"
        )
    if preempted_before is not None:
        preemptions = scheduler.num_preemptions - preempted_before
        print(f"preemptions   {preemptions} (sequences sent back to the queue for lack of KV blocks, to be recomputed)")
    spec_stats = getattr(getattr(engine, "runner", None), "spec_stats", None)
    if getattr(engine, "speculation", None) is not None and spec_stats is not None:
        print(f"speculation   {spec_stats.describe()}")
    compute, reads, steps = ceiling_time(workload, traffic, bandwidth, peak, engine.config)
    best = max(compute, reads)
    print(
        f"ceiling       {seconds(best)} = {workload.output_tokens / best:.1f} output tok/s, "
        f"{(workload.input_tokens + workload.output_tokens) / best:.1f} total tok/s "
        f"-> {100 * best / elapsed:.0f}% of ceiling "
        f"(compute: matrix products at {peak / 1e9:.2f} GFLOP/s = {seconds(compute)}; "
        f"weight reads: {steps} steps at {bandwidth / 1e9:.2f} GB/s = {seconds(reads)}; "
        f"attention and KV reads excluded)"
    )
    if generated != workload.output_tokens:
        print(f"atlas bench: generated {generated} tokens, expected {workload.output_tokens}", file=sys.stderr)
        return 1
    return 0


def _queued_ahead(engine: Any) -> int:
    """Decode steps the engine's runner has taken from its queue (0 where it queues none)."""
    ahead = getattr(getattr(engine, "runner", None), "ahead", None)
    return int(ahead.hits) if ahead is not None else 0
