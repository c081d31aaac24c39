"""``atlas bench latency``: prefill time and decode speed of N same-length prompts, beside the
memory-bandwidth roofline of decode (every step streams the weights its tokens select, and each
sequence's KV cache and recurrent state)."""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from atlas_core.bench.header import ceilings, print_header
from atlas_core.bench.roofline import (
    decode_compute_bound,
    decode_roofline,
    weight_traffic,
)
from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.errors import InvalidRequestError


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def latency_prompts(rng: np.random.Generator, batch: int, prompt_len: int, vocab_size: int) -> list[list[int]]:
    """``batch`` fresh random prompts of ``prompt_len`` token ids: every run draws new ones, so a
    prefix cache never serves a measured prefill."""
    return rng.integers(0, vocab_size, size=(batch, prompt_len)).tolist()


def timed(call: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def check_fits(llm: Any, batch: int, prompt_len: int, tokens: int) -> None:
    engine = llm.engine
    if prompt_len < 1 or tokens < 2 or batch < 1:
        raise InvalidRequestError("latency needs --prompt-len >= 1, --tokens >= 2 and --batch-size >= 1")
    if prompt_len + tokens > engine.max_seq_len:
        raise InvalidRequestError(
            f"--prompt-len {prompt_len} + --tokens {tokens} exceeds max_seq_len {engine.max_seq_len}"
        )
    if batch > engine.config.max_num_seqs:
        raise InvalidRequestError(f"--batch-size {batch} exceeds --max-num-seqs {engine.config.max_num_seqs}; raise it")
    capacity = getattr(engine, "kv_capacity_tokens", None)
    block = engine.config.block_size
    if capacity is not None and batch * -(-(prompt_len + tokens) // block) * block > capacity:
        raise InvalidRequestError(
            f"{batch} sequences of {prompt_len + tokens} tokens do not fit the KV cache ({capacity} tokens); "
            "raise --kv-cache-memory-gib"
        )


def run_latency(args: argparse.Namespace) -> int:
    from atlas_core.bench.cli import make_llm

    with make_llm(args) as llm:  # a split model's ranks stop with it
        return measure_latency(args, llm)


def measure_latency(args: argparse.Namespace, llm: Any) -> int:
    """Print the latency figures of ``llm`` for ``args``'s workload beside their ceilings."""
    batch, prompt_len, tokens = args.batch_size, args.prompt_len, args.tokens
    check_fits(llm, batch, prompt_len, tokens)
    traffic = weight_traffic(llm.loaded.model, llm.engine.kv_layouts)
    print_header("latency", llm, traffic)
    bandwidth, peak = ceilings(args, llm.backend)
    rng = np.random.default_rng(0)
    vocab = llm.loaded.model.vocab_size
    print(
        f"workload      batch {batch} x {prompt_len}-token prompts, {tokens} tokens generated each (greedy, ignore_eos)"
    )

    def run(max_tokens: int) -> tuple[float, Any]:
        prompts = latency_prompts(rng, batch, prompt_len, vocab)
        return timed(lambda: llm.generate(prompts, greedy(max_tokens)))

    run(min(8, tokens))  # warm-up
    prefill = min(run(1)[0] for _ in range(3))  # time to every sequence's first token, best of 3
    queue = llm.engine.runner.ahead
    queued_before = queue.hits if queue is not None else 0
    total, outputs = run(tokens)
    produced = [len(output.outputs[0].token_ids) for output in outputs]
    if produced != [tokens] * batch:
        raise InvalidRequestError(f"expected {tokens} tokens per sequence, got {produced}")
    steps = tokens - 1  # the first token comes out of the prefill step
    decode_time = total - prefill
    per_seq = steps / decode_time
    aggregate = batch * per_seq
    prefill_tokens = batch * prompt_len
    prefill_flops = traffic.flops(prefill_tokens, batch)
    print(
        f"prefill       {prefill_tokens} tokens in {1e3 * prefill:.2f} ms: {prefill_tokens / prefill:.1f} tok/s, "
        f"{prefill_flops / prefill / 1e9:.2f} GFLOP/s = {100 * prefill_flops / prefill / peak:.0f}% of matmul peak "
        "(includes sampling the first tokens)"
    )
    print(
        f"decode        {per_seq:.1f} tok/s per sequence, {aggregate:.1f} tok/s aggregate "
        f"(batch {batch}, {steps} steps in {decode_time:.3f} s)"
    )
    if llm.engine.speculation is not None:
        print(f"speculation   {llm.engine.runner.spec_stats.describe()}")
    if queue is not None:
        print(
            f"ahead         {queue.hits - queued_before} of {steps} decode steps launched before the tokens "
            "of the step before were read"
        )
    # decode step i (1 .. steps) attends over prompt_len + i cached tokens
    step_bytes = traffic.decode_step_bytes(batch, prompt_len + 1, steps)
    weight_bytes = traffic.bytes_for(batch)
    print(
        f"step bytes    {step_bytes:.0f} moved per decode step on average: weights {weight_bytes:.0f}, "
        f"KV cache and recurrent state {step_bytes - weight_bytes:.0f} ({batch} x contexts "
        f"{prompt_len + 1}..{prompt_len + steps})"
    )
    roofline = decode_roofline(bandwidth, traffic, batch, step_bytes)
    print(
        f"roofline      {roofline / batch:.1f} tok/s per sequence, {roofline:.1f} tok/s aggregate "
        f"at {bandwidth / 1e9:.2f} GB/s -> {100 * aggregate / roofline:.0f}% of roofline, "
        f"{per_seq * step_bytes / 1e9:.2f} GB/s achieved"
    )
    compute = decode_compute_bound(peak, traffic)
    print(
        f"compute bound {compute:.1f} tok/s aggregate at {peak / 1e9:.2f} GFLOP/s "
        f"-> {100 * aggregate / compute:.0f}% of it"
    )
    return 0
