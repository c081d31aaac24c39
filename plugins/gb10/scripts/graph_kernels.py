"""Per-kernel GPU time of one captured batch-1 decode step, read by Nsight Compute.

Run under ncu (it profiles only the replay, between cudaProfilerStart and Stop):
    ncu --clock-control none --profile-from-start off --csv --metrics gpu__time_duration.sum \\
        python graph_kernels.py qwen3-0.6b [NUM_LAYERS] > kernels.csv
    python graph_kernels.py --summarize kernels.csv
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict

import numpy as np


def replay(name: str, num_layers: int | None = None) -> None:
    import cupy

    from atlas_core import SamplingParams
    from atlas_core.bench.random_weights import PRESETS, random_weights_llm, text_config

    llm = random_weights_llm(name, backend="cuda", num_layers=num_layers)
    prompt = np.random.default_rng(0).integers(0, text_config(PRESETS[name])["vocab_size"], 100).tolist()
    llm.generate(prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    graph = next(iter(llm.engine.runner.decode_graphs.graphs.values()))[0]
    cupy.cuda.Device().synchronize()
    cupy.cuda.profiler.start()
    graph.launch()
    cupy.cuda.Device().synchronize()
    cupy.cuda.profiler.stop()


def summarize(path: str) -> None:
    totals: dict[str, list[float]] = defaultdict(list)
    with open(path) as handle:
        rows = [line for line in handle if line.startswith('"')]
    for row in csv.DictReader(rows):
        if row.get("Metric Name") == "gpu__time_duration.sum":
            value = float(row["Metric Value"].replace(",", ""))
            scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(row.get("Metric Unit", "nsecond"), 1e-3)
            totals[row["Kernel Name"].split("(")[0]].append(value * scale)
    grand = sum(sum(v) for v in totals.values())
    for kernel, times in sorted(totals.items(), key=lambda kv: -sum(kv[1])):
        print(f"{sum(times):9.1f} us  {len(times):4d} x {sum(times) / len(times):7.2f} us  {kernel}")
    print(f"{grand:9.1f} us  total GPU time of the replayed step (kernels back to back)")


if __name__ == "__main__":
    if sys.argv[1] == "--summarize":
        summarize(sys.argv[2])
    else:
        replay(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)
