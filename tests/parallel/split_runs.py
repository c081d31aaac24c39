"""What the ranks of the split-model tests run (module-level functions, importable by spawned ranks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from atlas_core import LLM
from atlas_core.backends.select import select_backend
from atlas_core.comm.rendezvous import WorldAddress
from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.model.sharding import ShardPlan, TensorParallel
from atlas_core.parallel.world import join_world
from atlas_core.plugins import get_registry
from atlas_core.weights.safetensors_source import SafetensorsSource

MAX_TOKENS = 4
KV_GIB = 1 / 64


def greedy(llm: LLM, prompts: list[Any]) -> list[tuple[list[int], list[float]]]:
    """Each prompt's (token ids, or a dict with images as `LLM.generate` takes it) greedy tokens and the
    log-probability of each."""
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=1, ignore_eos=True)
    outputs = llm.generate(prompts, params)
    results = []
    for output in outputs:
        completion = output.outputs[0]
        assert completion.logprobs is not None
        logprobs = [
            entry[token].logprob for token, entry in zip(completion.token_ids, completion.logprobs, strict=True)
        ]
        results.append((completion.token_ids, logprobs))
    return results


def run_split(
    address: WorldAddress, cases: list[tuple[Path, int, int]], prompts: list[list[int]]
) -> list[dict[str, Any]]:
    """Load each ``(checkpoint, tensor_parallel_size, expert_parallel_size)`` case on this rank (all ranks share one
    communicator) and generate greedily from ``prompts``; per case, the results and which tensors (and which
    parts of them) this rank read."""
    registry = get_registry()
    backend = select_backend(registry, "numpy")
    first = cases[0]
    world = join_world(address, ShardPlan(address.rank, first[1], first[2]), registry, backend, "cpu", {})
    reads: list[tuple[str, Any]] = []
    whole, part = SafetensorsSource.get, SafetensorsSource.get_part

    def get(self: SafetensorsSource, name: str) -> np.ndarray:
        reads.append((name, None))
        return whole(self, name)

    def get_part(self: SafetensorsSource, name: str, index: tuple[slice, ...]) -> np.ndarray:
        reads.append((name, [(s.start, s.stop) for s in index]))
        return part(self, name, index)

    SafetensorsSource.get, SafetensorsSource.get_part = get, get_part  # type: ignore[method-assign]
    results = []
    try:
        for folder, tp, ep in cases:
            reads.clear()
            parallel = TensorParallel(ShardPlan(address.rank, tp, ep), world.parallel.comm)
            llm = LLM(folder, backend="numpy", parallel=parallel, kv_cache_memory_gib=KV_GIB)
            results.append({"tokens": greedy(llm, prompts), "reads": list(reads)})
    finally:
        world.close()
    return results
