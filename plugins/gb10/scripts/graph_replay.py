"""GPU time of one captured batch-1 decode step (graph replay, no host work) of a random-weights model.

Usage: python graph_replay.py MODEL [NUM_LAYERS] [QUANTIZATION]   (needs a CUDA GPU)

Install two builds side by side (``pip install --target``) and run this under each ``PYTHONPATH`` in one
session to compare them: the figure excludes the engine's host work, which varies between runs.
"""

from __future__ import annotations

import sys

import numpy as np


def decode_step_us(name: str, num_layers: int | None = None, quantization: str | None = None) -> float:
    """Microseconds of GPU time of ``name``'s batch-1 decode graph (`timing.replay_us`)."""
    from timing import replay_us

    from atlas_core import SamplingParams
    from atlas_core.bench.random_weights import PRESETS, random_weights_llm, text_config

    llm = random_weights_llm(name, backend="cuda", num_layers=num_layers, quantization=quantization)
    prompt = np.random.default_rng(0).integers(0, text_config(PRESETS[name])["vocab_size"], 100).tolist()
    llm.generate(prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    graph = next(iter(llm.engine.runner.decode_graphs.graphs.values()))[0]
    return replay_us(graph, 100)


if __name__ == "__main__":
    model = sys.argv[1]
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else None
    quant = sys.argv[3] if len(sys.argv) > 3 else None
    us = decode_step_us(model, layers, quant)
    print(f"{model} ({layers or 'all'} layers, {quant or 'bf16'}): graph replay {us:.1f} us")
