"""Benchmarks of the NVMe KV tier (atlas-storage-nvme).

``disk``: write and read GB/s of the tier (whole records through `NvmeStorage`: packing, CRC-32, O_DIRECT
transfers, checks on read) for io_uring and the thread pool, beside ``dd`` sequential direct I/O of the same
size in the same directory.

``conversations``: the returning-conversation workload. N conversations each send a prefix of P random
tokens, one after another, into a device KV cache that holds only a few of them; then each returns with its
prefix plus a short new turn. Time to first token of the returning turns, without a storage tier (the prefix
is recomputed), with the host-memory tier and with the NVMe tier (the evicted prefix is loaded). The first
tokens of every configuration must be identical.

    uv run python scripts/bench_kv_tier.py disk --dir /path/on/the/disk [--gib 2] [--record-mib 2]
    uv run python scripts/bench_kv_tier.py conversations --dir /path/on/the/disk [MODEL] [--conversations 16]
        [--prefix-tokens 1024] [--cache-conversations 4]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from atlas_storage_nvme.tier import NvmeStorage

from atlas_core.storage import RecordFormat, TierSpec

if TYPE_CHECKING:
    from atlas_core import LLM, SamplingParams


def disk_line(directory: Path) -> str:
    """The filesystem and block device holding ``directory``."""
    target = os.path.realpath(directory)
    best = ("?", "?", "")
    with open("/proc/mounts", encoding="utf-8") as mounts:
        for line in mounts:
            source, mount, kind = line.split()[:3]
            if target.startswith(mount.rstrip("/") + "/") or target == mount:
                if len(mount) >= len(best[2]):
                    best = (source, kind, mount)
    model = Path(f"/sys/block/{Path(best[0]).name}/device/model")
    name = model.read_text().strip() if model.exists() else "model unknown"
    return f"{best[0]} ({name}), {best[1]} on {best[2]}"


def header(directory: Path) -> None:
    print(f"date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    print(f"host: {platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}")
    print(f"disk: {disk_line(directory)}")


def dd(arguments: list[str]) -> float:
    """GB/s that ``dd`` reports for ``arguments``."""
    result = subprocess.run(["dd", *arguments], capture_output=True, text=True, check=True)
    match = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", result.stderr)
    if match is None:
        raise RuntimeError(f"unexpected dd output: {result.stderr}")
    return int(match.group(1)) / float(match.group(2)) / 1e9


def bench_disk(args: argparse.Namespace) -> None:
    directory = Path(tempfile.mkdtemp(prefix="atlas-kv-bench-", dir=args.dir))
    header(directory)
    record = int(args.record_mib * 2**20)
    format = RecordFormat((((record,), np.dtype(np.uint8)),))
    total = int(args.gib * 2**30)
    batch = format.empty(args.batch)
    batch[0][:] = np.random.default_rng(0).integers(0, 256, batch[0].shape, dtype=np.uint8)
    print(f"records of {args.record_mib:g} MiB, {args.batch} per call, {total / 2**30:g} GiB written then read")
    try:
        for io in ("io_uring", "threads"):
            tier = NvmeStorage(TierSpec(format, total + 2**20, directory / io, "bench"), io=io)  # type: ignore[arg-type]
            count = tier.capacity_slots - tier.capacity_slots % args.batch
            calls = [list(range(start, start + args.batch)) for start in range(0, count, args.batch)]
            start = time.perf_counter()
            for slots in calls:
                tier.write(slots, slots, batch)
            write = count * record / (time.perf_counter() - start) / 1e9
            out = format.empty(args.batch)
            start = time.perf_counter()
            for slots in calls:
                assert tier.read(slots, out) == []
            read = count * record / (time.perf_counter() - start) / 1e9
            print(
                f"tier, {io:8} ({'O_DIRECT' if tier.direct else 'buffered'}): "
                f"write {write:.2f} GB/s, read {read:.2f} GB/s"
            )
            tier.close()
            shutil.rmtree(directory / io)
        size = f"{args.record_mib:g}M"
        count = str(total // record)
        target = directory / "dd.bin"
        write = dd(
            [
                "if=/dev/zero",
                f"of={target}",
                f"bs={size}",
                f"count={count}",
                "oflag=direct",
                "conv=fdatasync",
            ]
        )
        read = dd([f"if={target}", "of=/dev/null", f"bs={size}", "iflag=direct"])
        print(f"dd bs={size} direct, one request at a time: write {write:.2f} GB/s, read {read:.2f} GB/s")
    finally:
        shutil.rmtree(directory)


def bench_conversations(args: argparse.Namespace) -> None:
    from atlas_core import LLM, SamplingParams  # the disk benchmark runs without the engine's dependencies
    from atlas_core.bench.header import device_line

    def engine(**settings: Any) -> LLM:
        if args.random_weights:
            from atlas_core.bench.random_weights import random_weights_llm

            return random_weights_llm(args.model, backend=args.backend, **settings)
        return LLM(args.model, backend=args.backend, gguf_weights=args.gguf_weights, **settings)

    probe = engine()
    per_token = probe.engine.kv_plan.bytes_per_token
    vocab = probe.loaded.model.vocab_size
    print(device_line(probe.backend))
    del probe
    rng = np.random.default_rng(0)
    prefixes = [rng.integers(100, vocab, args.prefix_tokens).tolist() for _ in range(args.conversations)]
    returns = [p + rng.integers(100, vocab, args.turn_tokens).tolist() for p in prefixes]
    length = args.prefix_tokens + args.turn_tokens + 16
    tier_gib = 2 * args.conversations * (args.prefix_tokens + args.turn_tokens) * per_token / 2**30
    cache_gib = args.cache_conversations * length * per_token / 2**30
    directory = Path(tempfile.mkdtemp(prefix="atlas-kv-bench-", dir=args.dir))
    header(directory)
    print(
        f"model: {args.model or 'SmolLM2-135M-Instruct (built-in)'}, KV {per_token} bytes/token; {args.conversations} "
        f"conversations of {args.prefix_tokens} tokens, returning with {args.turn_tokens} more; device KV cache "
        f"{cache_gib * 2**30 / 2**20:.0f} MiB (about {args.cache_conversations} conversations); tiers "
        f"{tier_gib:.2f} GiB"
    )
    modes: dict[str, dict[str, Any]] = {
        "none": {},
        "host": {"swap_space_gb": tier_gib},
        "nvme": {"kv_spill_dir": str(directory), "kv_spill_gb": tier_gib},
    }
    first = SamplingParams(temperature=0, max_tokens=1)
    answers: dict[str, list[list[int]]] = {}
    try:
        for mode, settings in modes.items():
            llm = engine(kv_cache_memory_gib=cache_gib, max_seq_len=length, **settings)
            llm.generate(prefixes[0][:32], first)  # warm-up
            arrivals = [timed(llm, prompt, first)[0] for prompt in prefixes]
            returning = [timed(llm, prompt, first) for prompt in returns]
            answers[mode] = [tokens for _, tokens, _ in returning]
            ttft = [seconds for seconds, _, _ in returning]
            cached = sum(n for _, _, n in returning)
            print(
                f"{mode:5} first turn TTFT median {statistics.median(arrivals) * 1e3:8.1f} ms; returning turn TTFT "
                f"median {statistics.median(ttft) * 1e3:8.1f} ms, mean {statistics.mean(ttft) * 1e3:8.1f} ms; "
                f"prompt tokens reused {cached} of {sum(len(r) for r in returns)}"
            )
            llm.close()
            del llm
    finally:
        shutil.rmtree(directory)
    print("first tokens identical across modes:", all(a == answers["none"] for a in answers.values()))


def timed(llm: LLM, prompt: list[int], params: SamplingParams) -> tuple[float, list[int], int]:
    """Seconds to the first token, the tokens, and the prompt tokens served from a cache."""
    start = time.perf_counter()
    output = llm.generate(prompt, params)[0]
    return time.perf_counter() - start, list(output.outputs[0].token_ids), output.num_cached_tokens or 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    disk = commands.add_parser("disk", help="tier write/read GB/s beside dd")
    disk.add_argument("--dir", required=True, help="a directory on the disk to measure")
    disk.add_argument("--gib", type=float, default=2.0, help="data written then read, GiB")
    disk.add_argument(
        "--record-mib", type=float, default=2.0, help="record size (2 MiB: a 16-token bf16 block of Llama-3-8B)"
    )
    disk.add_argument("--batch", type=int, default=64, help="records per write / read call")
    conversations = commands.add_parser("conversations", help="returning-conversation TTFT, spill vs none")
    conversations.add_argument("model", nargs="?", default=None)
    conversations.add_argument("--backend", default=None)
    conversations.add_argument(
        "--random-weights", action="store_true", help="MODEL is a named shape (atlas bench's presets), random weights"
    )
    conversations.add_argument(
        "--gguf-weights",
        default="float",
        help="float (default): a step's cost follows its tokens; kept-quantized GGUF weights are dequantized on "
        "every step of the numpy backend, which would hide what the tiers save",
    )
    conversations.add_argument("--dir", required=True, help="a directory on the disk of the NVMe tier")
    conversations.add_argument("--conversations", type=int, default=16)
    conversations.add_argument("--prefix-tokens", type=int, default=1024)
    conversations.add_argument("--turn-tokens", type=int, default=16)
    conversations.add_argument("--cache-conversations", type=int, default=4)
    args = parser.parse_args()
    (bench_disk if args.command == "disk" else bench_conversations)(args)


if __name__ == "__main__":
    main()
