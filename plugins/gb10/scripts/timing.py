"""GPU timing helpers of the tile scripts: the device's copy bandwidth (the ceiling the streaming
products are compared with) and the GPU time of a call under CUDA-graph replay."""

from __future__ import annotations

from collections.abc import Callable

import cupy as cp
import numpy as np


def copy_bandwidth() -> float:
    """Bytes per second of a device-to-device copy of 1 GiB (read plus write)."""
    src, dst = cp.empty(2**30, dtype=np.uint8), cp.empty(2**30, dtype=np.uint8)
    dst[...] = src
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(10):
        dst[...] = src
    stop.record()
    stop.synchronize()
    return 2 * 10 * 2**30 / (cp.cuda.get_elapsed_time(start, stop) / 1e3)


def time_call(fn: Callable[[], object], iterations: int = 200) -> float:
    """Microseconds of GPU time per call: the call captured once into a CUDA graph (as decode runs it),
    the graph replayed back to back, so host launch costs do not count."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        fn()  # compile and allocate outside the capture
        stream.begin_capture()
        fn()
        graph = stream.end_capture()
        return replay_us(graph, iterations)


def time_rotating(calls: list[Callable[[], object]], backend: object, iterations: int = 50) -> float:
    """Microseconds of GPU time per call of ``calls`` (the same product over distinct copies of its weight, so
    that no weight is read from L2), captured in order into one CUDA graph as ``backend``'s programmatic launches
    (as a decode graph runs them) and replayed back to back."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for call in calls:
            call()  # compile and allocate outside the capture
        stream.synchronize()
        stream.begin_capture()
        with backend.kernels.programmatic_launches():  # type: ignore[attr-defined]
            for call in calls:
                call()
        graph = stream.end_capture()
        return replay_us(graph, iterations) / len(calls)


def replay_us(graph: object, iterations: int = 200) -> float:
    """Microseconds of GPU time per replay of a captured CUDA graph, replayed back to back on the current
    stream after a few warm-up replays."""
    for _ in range(5):
        graph.launch()  # type: ignore[attr-defined]
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(iterations):
        graph.launch()  # type: ignore[attr-defined]
    stop.record()
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) * 1e3 / iterations


def eager_ms(call: Callable[[], object], repeats: int = 50, warmup: int = 1) -> float:
    """Milliseconds of GPU time per call of ``call`` launched eagerly ``repeats`` times back to back (after
    ``warmup`` calls), between two CUDA events: host launch costs count where the GPU waits for them."""
    for _ in range(warmup):
        call()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(repeats):
        call()
    stop.record()
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) / repeats


def report(what: str, us: float, nbytes: int, peak: float) -> None:
    """One line: ``what``, the time, and the bandwidth ``nbytes`` read in that time reaches, also as a
    percentage of ``peak`` (bytes per second)."""
    share = 100 * nbytes / (us * 1e-6) / peak
    print(f"{what} {us:8.1f} us  {nbytes / us / 1e3:7.0f} GB/s  {share:5.1f}% of copy bandwidth", flush=True)


def rate(flops: float, us: float, peak_tflops: float) -> str:
    """A call's time beside its TFLOP/s and their share of ``peak_tflops``, as the scripts print them."""
    tflops = flops / us / 1e6
    return f"{us:9.1f} us {tflops:6.1f} TFLOP/s ({100 * tflops / peak_tflops:4.1f}%)"
