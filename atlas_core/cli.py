"""The ``atlas`` command: serve, generate, chat, bench, plugins."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from atlas_core import __version__
from atlas_core.errors import AtlasError


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Options shared by every command that loads a model (defaults shown in --help)."""
    parser.add_argument("model", nargs="?", default=None, help="model folder, .gguf file or Hugging Face repo id (default: the built-in SmolLM2-135M-Instruct)")
    parser.add_argument("--backend", default=None, help="backend name (default: the best available; see `atlas plugins`)")
    parser.add_argument("--max-seq-len", type=int, default=None, help="longest prompt + completion (default: the model's context, at most 8192)")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="most sequences in one batch (default: 64)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048, help="token budget of one forward step (default: 2048)")
    parser.add_argument("--max-prefill-tokens", type=int, default=None, help="largest prefill chunk of one sequence per step (default: --max-num-batched-tokens)")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True, help="reuse the KV of shared prompt prefixes (default: on)")
    parser.add_argument("--scheduling-policy", choices=["fifo", "slo"], default="fifo", help="fifo: arrival order; slo: shortest prompt first, decode-only steps near the TBT deadline (default: fifo)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="fraction of GPU memory the engine may use, KV cache included (default: 0.9)")
    parser.add_argument("--max-state-snapshots", type=int, default=None, help="hybrid recurrent models: saved recurrent states backing the prefix cache (default: --max-num-seqs; 0 turns prefix reuse off for them)")
    parser.add_argument("--kv-cache-memory-gib", type=float, default=1.0, help="KV cache size on CPU backends, GiB (default: 1.0)")


def engine_kwargs(args: argparse.Namespace) -> dict[str, object]:
    return {
        "backend": args.backend,
        "max_seq_len": args.max_seq_len,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_prefill_tokens": args.max_prefill_tokens,
        "enable_prefix_caching": args.enable_prefix_caching,
        "scheduling_policy": args.scheduling_policy,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "kv_cache_memory_gib": args.kv_cache_memory_gib,
        "max_state_snapshots": args.max_state_snapshots,
    }


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=256, help="most tokens to generate (default: 256)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: 0)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default: 1.0 = off)")
    parser.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens (default: 0 = off)")
    parser.add_argument("--seed", type=int, default=None, help="random seed for sampling (default: none)")


def build_parser() -> argparse.ArgumentParser:
    from atlas_core.bench import add_bench_parser
    from atlas_core.cli_plugins import add_plugins_parser
    from atlas_core.cli_run import add_chat_parser, add_generate_parser
    from atlas_core.server.cli_serve import add_serve_parser

    parser = argparse.ArgumentParser(prog="atlas", description="Atlas: LLM inference engine and OpenAI-compatible server")
    parser.add_argument("--version", action="version", version=f"atlas {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_serve_parser(commands)
    add_generate_parser(commands)
    add_chat_parser(commands)
    add_bench_parser(commands)
    add_plugins_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except AtlasError as exc:
        print(f"atlas: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
