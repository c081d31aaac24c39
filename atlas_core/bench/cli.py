"""The ``atlas bench`` command and its ``latency`` / ``throughput`` subcommands."""

from __future__ import annotations

import argparse
from typing import Any

from atlas_core.engine.config import ENGINE_OPTIONS
from atlas_core.errors import InvalidRequestError
from atlas_core.options.flags import add_flags, parsed_values

DESCRIPTION = """\
Measure the engine against its ceilings. Both subcommands print a header (device, BLAS, model,
weight and activation dtypes, engine settings, date) and each figure beside its roofline.

  latency     prefill time and decode tok/s of --batch-size same-length prompts, against the
              memory-bandwidth roofline (bandwidth / bytes moved per step: weights, and each
              sequence's KV cache and recurrent state; x batch)
  throughput  the nano-vllm / mini-sglang offline workload: --num-requests random-token requests,
              input and output lengths uniform in [--min-len, --max-len], submitted at once

`atlas bench` without a subcommand prints this help. Ceilings are measured on the backend (array
copy bandwidth, matrix-product FLOP/s) unless given with --bandwidth-gbps / --peak-gflops.
"""


def add_random_weights_arg(parser: argparse.ArgumentParser) -> None:
    from atlas_core.bench.random_weights import PRESETS, QUANTIZATIONS

    parser.add_argument(
        "--random-weights",
        action="store_true",
        help=f"MODEL is a preset ({', '.join(PRESETS)}) or a config.json path: build that shape with "
        "random bf16 weights instead of loading a checkpoint (no download, no tokenizer)",
    )
    parser.add_argument(
        "--num-layers",
        type=int,
        default=None,
        help="with --random-weights: keep only the first N layers (a shape too large for the device)",
    )
    parser.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default=None,
        help="with --random-weights: the decoder layers' linear weights in FP8 (128 x 128 blocks), NVFP4 or a GGUF "
        "block format (gguf_q4_k, ...), as such a checkpoint stores them (default: bf16)",
    )


def make_llm(args: argparse.Namespace) -> Any:
    """The `LLM` a benchmark runs: the checkpoint ``args.model``, or a random-weights model of its shape."""
    values = parsed_values(args, ENGINE_OPTIONS)
    if args.quantization and not args.random_weights:
        raise InvalidRequestError("--quantization builds random quantized weights: it needs --random-weights")
    if args.random_weights:
        from atlas_core.bench.random_weights import PRESETS, random_weights_llm

        model = values.pop("model")
        if model is None:
            raise InvalidRequestError(
                f"--random-weights needs MODEL: a preset ({', '.join(PRESETS)}) or a config.json path"
            )
        return random_weights_llm(model, num_layers=args.num_layers, quantization=args.quantization, **values)
    from atlas_core.engine.llm import LLM

    return LLM(**values)


def add_ceiling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bandwidth-gbps",
        type=float,
        default=None,
        help=(
            "memory bandwidth ceiling in GB/s "
            "(default: measured, an array copy: 512 MiB on host backends, 2 GiB on devices)"
        ),
    )
    parser.add_argument(
        "--peak-gflops",
        type=float,
        default=None,
        help="matrix-product ceiling in GFLOP/s (default: measured, a 1024^3 product)",
    )


def add_bench_parser(commands: Any) -> None:
    from atlas_core.bench.latency import run_latency
    from atlas_core.bench.throughput import run_throughput

    parser = commands.add_parser(
        "bench",
        help="latency and throughput benchmarks beside their rooflines",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(handler=lambda args: print_help(parser))
    subcommands = parser.add_subparsers(dest="bench_command", metavar="SUBCOMMAND")

    latency = subcommands.add_parser(
        "latency",
        help="prefill time and decode tok/s at --batch-size, against the bandwidth roofline",
        description="Prefill time and decode speed of --batch-size prompts of --prompt-len tokens, greedy, "
        "ignore_eos; decode beside its roofline: batch x bandwidth / bytes moved per step (the weights the "
        "batch selects, each sequence's KV cache and recurrent state).",
    )
    add_flags(latency, ENGINE_OPTIONS)
    add_ceiling_args(latency)
    add_random_weights_arg(latency)
    latency.add_argument("--tokens", type=int, default=128, help="tokens generated per sequence (default: 128)")
    latency.add_argument("--prompt-len", type=int, default=32, help="prompt length in tokens (default: 32)")
    latency.add_argument("--batch-size", type=int, default=1, help="sequences decoded together (default: 1)")
    latency.set_defaults(handler=run_latency)

    throughput = subcommands.add_parser(
        "throughput",
        help="offline throughput on random requests (the nano-vllm / mini-sglang workload)",
        description="--num-requests requests of random token ids; input and output lengths uniform in "
        "[--min-len, --max-len] (clamped to max_seq_len / 2), ignore_eos, all submitted at once through "
        "LLM.generate. Prints total time, output and total tok/s, requests/s.",
    )
    add_flags(throughput, ENGINE_OPTIONS)
    add_ceiling_args(throughput)
    add_random_weights_arg(throughput)
    throughput.add_argument("--num-requests", type=int, default=256, help="requests (default: 256)")
    throughput.add_argument("--min-len", type=int, default=100, help="shortest input and output length (default: 100)")
    throughput.add_argument("--max-len", type=int, default=1024, help="longest input and output length (default: 1024)")
    throughput.add_argument("--seed", type=int, default=0, help="seed of the lengths and token ids (default: 0)")
    throughput.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default: 0 = greedy)")
    throughput.add_argument("--progress", action="store_true", help="show a progress bar on stderr")
    throughput.set_defaults(handler=run_throughput)


def print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2
