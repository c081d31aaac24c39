"""The header both benchmarks print: device, model, dtypes, engine settings, date, ceilings."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
from collections import Counter
from typing import Any

import numpy as np

from atlas_core.bench.roofline import (
    WeightTraffic,
    measure_copy_bandwidth,
    measure_matmul_flops,
)
from atlas_core.weights.gguf_quantized import FORMATS as GGUF_FORMATS
from atlas_core.weights.random_source import RandomWeightSource

THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def blas_name() -> str:
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:  # noqa: BLE001 - older NumPy: no dict form
        return "unknown BLAS"


def device_line(backend: Any) -> str:
    cores = os.cpu_count() or 0
    if backend.name == "numpy":
        threads = "".join(f", {var}={os.environ[var]}" for var in THREAD_VARIABLES if os.environ.get(var))
        return (
            f"{backend.name} backend on {cpu_model()} ({platform.machine()}, {cores} cores), "
            f"NumPy {np.__version__} with {blas_name()}{threads}, Python {platform.python_version()}"
        )
    described = getattr(backend, "device_name", None) or getattr(backend, "device", None)
    return (
        f"{backend.name} backend" + (f" on {described}" if described else "") + f", host {cpu_model()} ({cores} cores)"
    )


def checkpoint_dtypes(loaded: Any) -> str:
    """What the checkpoint stores, e.g. ``GGUF Q4_1 69%, Q8_0 31%`` or ``safetensors bfloat16``."""
    resolved = loaded.resolved
    if isinstance(loaded.source, RandomWeightSource):
        scheme, gguf_type = loaded.source.quantization, loaded.source.gguf_type
        quantized = "" if scheme is None else f", decoder linear weights {scheme.format} ({scheme.method})"
        if gguf_type is not None:
            quantized = f", decoder linear weights {GGUF_FORMATS[gguf_type]} (GGUF blocks)"
        return f"none: random bf16 weights{quantized} (--random-weights)"
    if resolved.kind == "gguf":
        try:
            from atlas_core.weights.gguf_index import open_gguf

            sizes: Counter[str] = Counter()
            for tensor in open_gguf(resolved.path).header.tensors.values():
                sizes[tensor.type.name] += tensor.n_bytes
            total = sum(sizes.values()) or 1
            shares = [(name, 100 * size / total) for name, size in sizes.most_common()]
            return "GGUF " + ", ".join(
                f"{name} {share:.0f}%" if share >= 1 else f"{name} <1%" for name, share in shares
            )
        except Exception:  # noqa: BLE001 - informational only
            return "GGUF"
    dtype = loaded.config.get("torch_dtype") or loaded.config.get("dtype") or "?"
    return f"safetensors {dtype}"


def describe_bytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def print_header(title: str, llm: Any, traffic: WeightTraffic) -> None:
    engine, config = llm.engine, llm.engine.config
    stored = ", ".join(f"{dtype} {describe_bytes(size)}" for dtype, size in traffic.dtypes.items())
    embedding = (
        "tied to the lm_head, read in full"
        if traffic.tied_embeddings
        else "embedding table excluded: a step gathers rows"
    )
    if traffic.gathered_bytes:
        embedding += f"; {describe_bytes(traffic.gathered_bytes)} of other gathered tables excluded"
    capacity = getattr(engine, "kv_capacity_tokens", None)
    shown = {"max_seq_len", "max_num_seqs", "max_num_batched_tokens", "block_size"}
    others = ", ".join(f"{f.name} {getattr(config, f.name)}" for f in dataclasses.fields(config) if f.name not in shown)
    print(f"== atlas bench {title} ==")
    print(f"date          {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}")
    print(f"device        {device_line(llm.backend)}")
    print(f"model         {llm.loaded.name} ({llm.loaded.resolved.path})")
    print(f"weights       {stored} on the backend (checkpoint: {checkpoint_dtypes(llm.loaded)})")
    print(f"activations   {np.dtype(llm.backend.activation_dtype)}")
    print(
        f"engine        max_seq_len {engine.max_seq_len}, max_num_seqs {config.max_num_seqs}, "
        f"max_num_batched_tokens {config.max_num_batched_tokens}, block_size {config.block_size}, "
        f"KV capacity {capacity if capacity is not None else '?'} tokens"
    )
    print(f"engine config {others}")
    world = config.replica_settings().world
    if world > 1:
        print(
            f"split         {world} ranks, one device each: the bytes below are rank 0's shard, and each rank reads "
            "its own shard in the same step, so the roofline is one device's bandwidth over rank 0's bytes"
        )
    print(
        f"weights/step  {traffic.bytes_per_step} bytes ({describe_bytes(traffic.bytes_per_step)}) "
        f"read per forward step ({embedding})"
    )
    if traffic.expert_banks:
        bank = traffic.expert_banks[0]
        print(
            f"experts       {len(traffic.expert_banks)} MoE layers, top-{bank.top_k} of {bank.num_experts}: "
            f"a 1-token step reads {describe_bytes(int(traffic.bytes_for(1)))}, "
            f"a 64-token step {describe_bytes(int(traffic.bytes_for(64)))}"
        )
    sequence = sequence_line(traffic)
    if sequence:
        print(f"per sequence  {sequence}")
    print(f"flops/token   {traffic.flops(1, 0):.4g} (decoder) + {traffic.flops(0, 1):.4g} (lm_head, sampled rows only)")


def sequence_line(traffic: WeightTraffic) -> str:
    """What a decode step moves per sequence besides the weights (`SequenceTraffic`), or "" for nothing."""
    sequence = traffic.sequence
    parts = []
    if sequence.kv_reads:
        full = sum(read.bytes_per_token for read in sequence.kv_reads if read.window is None)
        windows = sorted({read.window for read in sequence.kv_reads if read.window is not None})
        windowed = sum(read.bytes_per_token for read in sequence.kv_reads if read.window is not None)
        part = f"KV cache {full} bytes read per cached token ({len(sequence.kv_reads)} attention layers"
        if windows:
            part += f"; plus {windowed} bytes per token of the last {', '.join(map(str, windows))} tokens"
        parts.append(part + f"), {sequence.kv_write_bytes} bytes written per step")
    if sequence.state_bytes:
        parts.append(f"recurrent state {describe_bytes(sequence.state_bytes)} read and written per step")
    return "; ".join(parts)


def ceilings(args: argparse.Namespace, backend: Any) -> tuple[float, float]:
    """Print and return (bandwidth bytes/s, matmul FLOP/s): given on the command line, else measured."""
    if args.bandwidth_gbps is not None:
        bandwidth, how = args.bandwidth_gbps * 1e9, "given with --bandwidth-gbps"
    else:
        bandwidth, how = (
            measure_copy_bandwidth(backend),
            "measured: array copy (512 MiB on host, 2 GiB on a device), read + write, best of 5",
        )
    print(f"bandwidth     {bandwidth / 1e9:.2f} GB/s ({how})")
    if args.peak_gflops is not None:
        peak, how = args.peak_gflops * 1e9, "given with --peak-gflops"
    else:
        peak, how = measure_matmul_flops(backend), "measured: 1024^3 fp32 matrix product, best of 5"
    print(f"matmul peak   {peak / 1e9:.2f} GFLOP/s ({how})")
    return bandwidth, peak
