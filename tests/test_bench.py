"""``atlas bench latency`` / ``throughput`` run in-process on the tiny checkpoints, and the roofline arithmetic."""

from __future__ import annotations

import re

import numpy as np
import pytest

from atlas_core.backends.numpy_backend import NumpyBackend
from atlas_core.bench.roofline import decode_roofline, weight_traffic
from atlas_core.bench.throughput import make_workload
from atlas_core.cli import main
from atlas_core.weights.safetensors_source import SafetensorsSource
from tests.conftest import TINY

NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
CEILINGS = ["--bandwidth-gbps", "10", "--peak-gflops", "50"]  # given, so the tests measure nothing


def bench(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["bench", *args])
    return code, capsys.readouterr().out


def numbers(out: str, label: str, pattern: str) -> tuple[float, ...]:
    """The numbers ``pattern`` captures on the line that starts with ``label``."""
    line = next(line for line in out.splitlines() if line.startswith(label))
    match = re.search(pattern.replace("#", NUMBER), line)
    assert match, f"{pattern!r} not in {line!r}"
    return tuple(float(value) for value in match.groups())


def check_header(out: str, title: str, model: str) -> int:
    """The shared header; returns the weight bytes read per step."""
    assert out.startswith(f"== atlas bench {title} ==")
    assert re.search(r"^date +\d{4}-\d\d-\d\d \d\d:\d\d$", out, re.M)
    assert re.search(r"^device +numpy backend on .+\(.+, \d+ cores\), NumPy .+ with .+$", out, re.M)
    assert re.search(rf"^model +{model} ", out, re.M)
    assert re.search(r"^weights +float32 .+ \(checkpoint: safetensors float32\)$", out, re.M)
    assert re.search(r"^activations +float32$", out, re.M)
    (max_seq_len, max_num_seqs, budget, block, capacity) = numbers(
        out, "engine ", "max_seq_len #, max_num_seqs #, max_num_batched_tokens #, block_size #, KV capacity # tokens"
    )
    assert (max_seq_len, max_num_seqs, budget, block) == (512, 64, 2048, 16) and capacity > 0
    (step_bytes,) = numbers(out, "weights/step", r"^weights/step +# bytes")
    assert numbers(out, "bandwidth", r"# GB/s \(given") == (10.0,)
    assert numbers(out, "matmul peak", r"# GFLOP/s \(given") == (50.0,)
    return int(step_bytes)


@pytest.mark.parametrize("name", ["llama", "qwen3_tied"])
def test_weight_traffic_counts_every_weight_once(name: str) -> None:
    from atlas_core import LLM

    llm = LLM(TINY / name, backend="numpy")
    source = SafetensorsSource(TINY / name)
    elements = sum(int(np.prod(source.get(key).shape)) for key in source.names())
    traffic = weight_traffic(llm.loaded.model)
    assert traffic.total_bytes == 4 * elements  # float32 on the numpy backend; RoPE tables are not weights
    embedding = traffic.embedding_bytes
    assert traffic.bytes_per_step == (
        traffic.total_bytes if traffic.tied_embeddings else traffic.total_bytes - embedding
    )
    assert traffic.tied_embeddings == (name == "qwen3_tied")
    assert decode_roofline(10e9, traffic, 4) == pytest.approx(4 * 10e9 / traffic.bytes_per_step)


def test_bench_without_subcommand_lists_both(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = bench(capsys)
    assert code == 2
    assert "latency" in out and "throughput" in out and "without a subcommand prints this help" in out


def test_latency_uses_the_given_bandwidth(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = bench(
        capsys,
        "latency",
        str(TINY / "llama"),
        *CEILINGS,
        "--tokens",
        "12",
        "--prompt-len",
        "8",
        "--batch-size",
        "3",
    )
    assert code == 0
    step_bytes = check_header(out, "latency", "llama")
    assert numbers(out, "workload", "batch # x #-token prompts, # tokens") == (3, 8, 12)
    prefill_tokens, prefill_ms, prefill_rate, gflops = numbers(out, "prefill", "# tokens in # ms: # tok/s, # GFLOP/s")
    assert prefill_tokens == 24 and min(prefill_ms, prefill_rate, gflops) > 0
    per_seq, aggregate, batch, steps, seconds = numbers(
        out, "decode", "# tok/s per sequence, # tok/s aggregate \\(batch #, # steps in # s\\)"
    )
    assert (batch, steps) == (3, 11) and min(per_seq, seconds) > 0
    assert aggregate == pytest.approx(3 * per_seq, abs=0.2)
    moved, weights, sequences = numbers(out, "step bytes", "# moved per decode step on average: weights #, .* # \\(")
    # tiny llama: 3 layers of 2 KV heads x 16 dims, float32: 3 x 2 x 2 x 16 x 4 = 768 bytes per token,
    # read over contexts 9 .. 19 (mean 14), and one token written per step
    assert weights == step_bytes and sequences == 3 * (768 * 14 + 768)
    assert moved == weights + sequences
    roof_seq, roof_all, bandwidth, percent, achieved = numbers(
        out, "roofline", "# tok/s per sequence, # tok/s aggregate at # GB/s -> #% of roofline, # GB/s achieved"
    )
    assert bandwidth == 10.0
    assert roof_seq == pytest.approx(10e9 / moved, abs=0.1)
    assert roof_all == pytest.approx(3 * 10e9 / moved, abs=0.1)
    assert percent == pytest.approx(round(100 * aggregate / roof_all), abs=1)
    assert achieved == pytest.approx(per_seq * moved / 1e9, abs=0.01)
    (compute,) = numbers(out, "compute bound", "# tok/s aggregate at 50.00 GFLOP/s")
    assert compute > 0


def test_throughput_generates_exactly_the_requested_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = bench(
        capsys,
        "throughput",
        str(TINY / "llama"),
        *CEILINGS,
        "--num-requests",
        "6",
        "--min-len",
        "4",
        "--max-len",
        "20",
    )
    assert code == 0
    check_header(out, "throughput", "llama")
    workload = make_workload(6, 4, 20, 0, 256, 512)
    assert all(4 <= n <= 20 for n in workload.output_lens) and all(4 <= len(p) <= 20 for p in workload.prompts)
    assert numbers(out, "workload", "# requests, input and output lengths uniform in \\[#, #\\], seed #") == (
        6,
        4,
        20,
        0,
    )
    assert "clamped" not in out
    inputs, outputs, requested, total = numbers(out, "tokens", "input #, output # \\(requested #\\), total #")
    assert outputs == requested == sum(workload.output_lens)
    assert inputs == workload.input_tokens and total == inputs + outputs
    (seconds,) = numbers(out, "time", "# s")
    out_rate, total_rate, req_rate = numbers(out, "throughput", "# output tok/s, # total tok/s, # req/s")
    assert seconds > 0 and min(out_rate, total_rate, req_rate) > 0
    # the time is printed to the millisecond: allow that rounding on short runs
    assert out_rate == pytest.approx(outputs / seconds, rel=0.0006 / seconds + 0.01)
    assert req_rate == pytest.approx(6 / seconds, rel=0.0006 / seconds + 0.01)
    (percent,) = numbers(out, "ceiling", "total tok/s -> #% of ceiling")
    assert 0 <= percent <= 100
    steps, queued = numbers(out, "steps", "# forward steps, # of them launched before the tokens")
    assert max(workload.output_lens) <= steps <= outputs and queued == 0  # the numpy backend queues no work


def test_throughput_counts_the_steps_queued_ahead(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a backend that queues work, decode steps of the same sequences are launched ahead (`tests/test_ahead.py`
    runs the numpy backend so)."""
    monkeypatch.setattr(NumpyBackend, "queues_work", True)
    args = ("--num-requests", "2", "--min-len", "30", "--max-len", "30")
    code, out = bench(capsys, "throughput", str(TINY / "llama"), *CEILINGS, *args)
    assert code == 0
    steps, queued = numbers(out, "steps", "# forward steps, # of them launched before the tokens")
    assert steps == 30 and queued == 28  # a prefill step, then decode steps: all but the first queued


def test_throughput_clamps_lengths_to_max_seq_len(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = bench(
        capsys,
        "throughput",
        str(TINY / "qwen3"),
        *CEILINGS,
        "--num-requests",
        "3",
        "--min-len",
        "8",
        "--max-len",
        "1024",
        "--max-seq-len",
        "64",
    )
    assert code == 0
    assert numbers(out, "clamped", "8/1024 -> #/# so that prompt \\+ output <= max_seq_len #") == (8, 32, 64)
    workload = make_workload(3, 8, 1024, 0, 256, 64)
    assert all(len(p) + n <= 64 for p, n in zip(workload.prompts, workload.output_lens, strict=True))
    _, outputs, requested, _ = numbers(out, "tokens", "input #, output # \\(requested #\\), total #")
    assert outputs == requested == sum(workload.output_lens)
