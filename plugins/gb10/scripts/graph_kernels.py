"""Per-kernel GPU time of one captured decode step, read by Nsight Compute.

Run under ncu (it profiles only the replay, between cudaProfilerStart and Stop):
    ncu --clock-control none --profile-from-start off --csv --metrics gpu__time_duration.sum \\
        python graph_kernels.py qwen3-0.6b [--num-layers N] [--num-seqs 1] [--prompt-len 100] > kernels.csv
    python graph_kernels.py --summarize kernels.csv

``--num-seqs`` sequences of ``--prompt-len`` random tokens decode 8 tokens each; then the decode graph of their
batch bucket is replayed once more over their last step's inputs (a batch of 128 sequences of 800 tokens: a
step of the offline throughput run).
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict

import numpy as np


def replay(name: str, num_layers: int | None, num_seqs: int, prompt_len: int) -> None:
    import cupy

    from atlas_core import SamplingParams
    from atlas_core.bench.random_weights import PRESETS, random_weights_llm, text_config

    llm = random_weights_llm(name, backend="cuda", num_layers=num_layers, max_num_seqs=max(num_seqs, 1))
    vocab = text_config(PRESETS[name])["vocab_size"]
    rng = np.random.default_rng(0)
    prompts = [{"prompt_token_ids": rng.integers(0, vocab, prompt_len).tolist()} for _ in range(num_seqs)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    graphs = llm.engine.runner.decode_graphs.graphs
    graph = graphs[max(graphs)][0]  # the largest batch bucket: the one every sequence decoded in
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
        parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("model", help="a preset of `atlas bench` (random weights)")
        parser.add_argument("--num-layers", type=int, default=None)
        parser.add_argument("--num-seqs", type=int, default=1)
        parser.add_argument("--prompt-len", type=int, default=100)
        args = parser.parse_args()
        replay(args.model, args.num_layers, args.num_seqs, args.prompt_len)
