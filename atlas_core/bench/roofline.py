"""Roofline arithmetic for ``atlas bench``, kept in one place.

Two ceilings bound every figure the benchmarks print:

* Memory bandwidth. Each forward step reads every dense weight once, whatever the batch, and of each
  Mixture-of-Experts layer's routed experts only the distinct experts its tokens select: for B tokens
  and top-k of E experts, ``E * (1 - (1 - k/E)**B)`` experts on average (`WeightTraffic.bytes_for`).
  Each sequence adds what its step reads and writes besides the weights: its KV cache (MLA's latent
  rows for MLA layers, at most a sliding window for windowed layers) and its recurrent state, read
  and written (`atlas_core.bench.sequence_traffic`). So decode at batch N is at most
  ``N * bandwidth / decode_step_bytes(N, ...)`` tokens/s, an upper bound.
* Compute. Each token through the decoder costs ``2 * body_params`` FLOPs (dense matrices plus the
  k experts it is routed to) and each sampled row ``2 * head_params`` more for the lm_head (the
  engine computes logits only for rows it samples); attention FLOPs are left out, which again keeps
  the bound an upper bound on speed.

Bandwidth is measured as a large array copy on the backend (read + write bytes / time) and compute
as a square matrix product through ``backend.linear``; both can be given instead.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from atlas_core.bench.sequence_traffic import SequenceTraffic, sequence_traffic

# Precomputed tables that are attributes of the model but not weights: a step reads a few rows.
NON_WEIGHT_ATTRIBUTES = frozenset({"rope_cos", "rope_sin", "cos", "sin", "inv_freq", "position_scale"})
RUNTIME_ATTRIBUTES = frozenset({"backend", "mirror", "comm"})
"""Attributes linking a model to what runs it (the backend; a split replica's mirror and communicator)."""
ENCODER_ATTRIBUTES = frozenset({"vision"})
"""Model attributes holding an input encoder (a vision tower): it runs on prefill steps that hold images,
never in a decode step, so its weights are not decode traffic."""
GATHERED_WEIGHTS = "gathered_weights"
"""A layer class attribute naming the attributes that hold lookup tables a step gathers rows from
(like the embedding table; e.g. Gemma 4's per-layer embeddings): not read in full, not multiplied."""


@dataclass(frozen=True)
class ExpertBank:
    """The routed experts of one MoE layer: their bytes and elements, E experts, top-k per token."""

    nbytes: int
    params: int
    num_experts: int
    top_k: int

    def expected_active(self, tokens: int) -> float:
        """Expected distinct experts ``tokens`` tokens select (uniform routing)."""
        return self.num_experts * (1.0 - (1.0 - self.top_k / self.num_experts) ** tokens)


@dataclass(frozen=True)
class WeightTraffic:
    """What one forward step of ``model`` reads and computes.

    ``total_bytes``: every distinct weight array reachable from the model, each counted once.
    ``bytes_per_step``: the same minus the embedding table (a step gathers a few rows of it),
    unless it is tied to the lm_head, which reads it in full, and minus the other gathered tables
    (`GATHERED_WEIGHTS`, ``gathered_bytes``): what a step reads when every routed expert is selected
    (`bytes_for` counts the experts a batch really selects).
    ``body_params`` / ``head_params``: elements of the matrices (2-D or more) a token is multiplied
    by in the decoder (of the routed experts, only its top-k) / in the lm_head.
    ``expert_banks``: the routed experts of each MoE layer. ``sequence``: what a decode step reads
    and writes per sequence besides the weights (KV cache, recurrent state).
    """

    total_bytes: int
    bytes_per_step: int
    embedding_bytes: int
    tied_embeddings: bool
    body_params: int
    head_params: int
    dtypes: dict[str, int]  # stored dtype -> bytes
    expert_banks: tuple[ExpertBank, ...] = ()
    sequence: SequenceTraffic = SequenceTraffic()
    gathered_bytes: int = 0

    def bytes_for(self, tokens: int) -> float:
        """Expected weight bytes a forward step over ``tokens`` tokens reads: the dense weights and, of
        each MoE layer, the expected distinct experts those tokens select."""
        routed = sum(bank.nbytes * bank.expected_active(tokens) / bank.num_experts for bank in self.expert_banks)
        return self.bytes_per_step - sum(bank.nbytes for bank in self.expert_banks) + routed

    def decode_step_bytes(self, batch: int, first_context: int, steps: int = 1) -> float:
        """Mean bytes a decode step of ``batch`` sequences moves over ``steps`` steps from
        ``first_context`` cached tokens on: the weights its tokens select (`bytes_for`) plus each
        sequence's KV reads and writes and recurrent state (`SequenceTraffic.mean_step_bytes`)."""
        return self.bytes_for(batch) + batch * self.sequence.mean_step_bytes(first_context, steps)

    def flops(self, body_tokens: int, sampled_rows: int) -> float:
        """Matrix-product FLOPs of ``body_tokens`` tokens through the decoder, ``sampled_rows`` through the lm_head."""
        return 2.0 * self.body_params * body_tokens + 2.0 * self.head_params * sampled_rows


def model_weights(model: Any, max_depth: int = 12) -> tuple[dict[int, Any], list[Any]]:
    """Every distinct array reachable from ``model`` through attributes, lists, tuples and dicts, and
    every distinct object visited on the way (layers, blocks...). The recurrent state (per-sequence
    data, `atlas_core.bench.sequence_traffic`), `NON_WEIGHT_ATTRIBUTES`, `ENCODER_ATTRIBUTES` and
    `RUNTIME_ATTRIBUTES` are not walked."""
    from atlas_core.model.recurrent_state import RecurrentState

    seen: dict[int, Any] = {}
    visited: dict[int, Any] = {}

    def walk(value: Any, depth: int) -> None:
        if hasattr(value, "shape") and isinstance(getattr(value, "nbytes", None), int):
            seen.setdefault(id(value), value)
            return
        if depth >= max_depth or id(value) in visited or isinstance(value, RecurrentState):
            return
        visited[id(value)] = value
        if isinstance(value, (list, tuple)):
            items: Any = value
        elif isinstance(value, dict):
            items = value.values()
        elif hasattr(value, "__dict__"):
            items = [
                item
                for name, item in vars(value).items()
                if name not in NON_WEIGHT_ATTRIBUTES | ENCODER_ATTRIBUTES | RUNTIME_ATTRIBUTES
            ]
        else:
            return
        for item in items:
            walk(item, depth + 1)

    walk(model, 0)
    return seen, list(visited.values())


def expert_banks(objects: list[Any]) -> dict[int, ExpertBank]:
    """id of each routed-expert weight array -> the bank it belongs to, for every MoE block among
    ``objects`` (a block with a `RouterSpec` ``spec`` and ``experts`` holding ``w_in`` / ``w_out``)."""
    from atlas_core.backends.ops.moe import RouterSpec

    banks: dict[int, ExpertBank] = {}
    for obj in objects:
        spec = getattr(obj, "spec", None)
        experts: Any = getattr(obj, "experts", None)  # duck-typed: any object holding w_in and w_out
        if isinstance(spec, RouterSpec) and hasattr(experts, "w_in") and hasattr(experts, "w_out"):
            arrays = (experts.w_in, experts.w_out)
            bank = ExpertBank(
                nbytes=sum(int(a.nbytes) for a in arrays),
                params=sum(int(np.prod(a.shape)) for a in arrays),
                num_experts=spec.num_experts,
                top_k=spec.top_k,
            )
            banks.update({id(a): bank for a in arrays})
    return banks


def gathered_tables(objects: list[Any]) -> dict[int, Any]:
    """id -> array of every table the layers among ``objects`` name in their `GATHERED_WEIGHTS`."""
    tables: dict[int, Any] = {}
    for obj in objects:
        for name in getattr(type(obj), GATHERED_WEIGHTS, ()):
            table = getattr(obj, name, None)
            if table is not None:
                tables[id(table)] = table
    return tables


def weight_traffic(model: Any, kv_layouts: Sequence[Any] | None = None) -> WeightTraffic:
    """What one forward step of ``model`` (a `TransformerModel`) reads and computes (`WeightTraffic`);
    ``kv_layouts``: the KV layouts as the engine stores them (`sequence_traffic`), None for the model's."""
    weights, objects = model_weights(model)
    banks = expert_banks(objects)
    embed, head = model.embed_tokens, model.lm_head
    tied = head is embed
    gathered = {key: table for key, table in gathered_tables(objects).items() if key in weights and table is not head}
    total = sum(int(w.nbytes) for w in weights.values())
    dtypes: dict[str, int] = {}
    for w in weights.values():
        dtypes[str(w.dtype)] = dtypes.get(str(w.dtype), 0) + int(w.nbytes)
    matrices = [
        w
        for key, w in weights.items()
        if len(w.shape) >= 2 and w is not embed and w is not head and key not in banks and key not in gathered
    ]
    distinct_banks = tuple({id(bank): bank for bank in banks.values()}.values())
    routed_params = sum(bank.params * bank.top_k / bank.num_experts for bank in distinct_banks)
    gathered_bytes = sum(int(table.nbytes) for key, table in gathered.items() if table is not embed)
    return WeightTraffic(
        total_bytes=total,
        bytes_per_step=total - (0 if tied else int(embed.nbytes)) - gathered_bytes,
        embedding_bytes=int(embed.nbytes),
        tied_embeddings=tied,
        body_params=sum(int(np.prod(w.shape)) for w in matrices) + round(routed_params),
        head_params=int(np.prod(head.shape)),
        dtypes=dtypes,
        expert_banks=distinct_banks,
        sequence=sequence_traffic(model, objects, kv_layouts),
        gathered_bytes=gathered_bytes,
    )


def decode_roofline(bandwidth: float, traffic: WeightTraffic, batch: int, step_bytes: float | None = None) -> float:
    """Aggregate tokens/s of decode at ``batch`` sequences if every step only streamed ``step_bytes``
    (`WeightTraffic.decode_step_bytes`; None: the weights alone, `WeightTraffic.bytes_for`)."""
    return batch * bandwidth / (traffic.bytes_for(batch) if step_bytes is None else step_bytes)


def decode_compute_bound(peak_flops: float, traffic: WeightTraffic) -> float:
    """Aggregate decode tokens/s if every step ran its matrix products at ``peak_flops``."""
    return peak_flops / traffic.flops(1, 1)


def measure_copy_bandwidth(backend: Any, megabytes: int | None = None, repeats: int = 5) -> float:
    """Bytes per second of ``dst[...] = src`` for a ``megabytes`` float32 array (best of ``repeats``);
    512 MiB on host backends, 2 GiB on device backends (so the launch and the sync are a small share)."""
    if megabytes is None:
        megabytes = 512 if backend.device_memory() is None else 2048
    src = backend.from_numpy(np.ones(megabytes * 2**20 // 4, dtype=np.float32), dtype=np.dtype(np.float32))
    dst = backend.zeros(src.shape, src.dtype)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst[...] = src
        backend.to_numpy(dst[:1])
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best


def measure_matmul_flops(backend: Any, size: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of ``backend.linear`` on ``[size, size] x [size, size]^T`` (best of ``repeats``)."""
    rng = np.random.default_rng(0)
    x = backend.from_numpy(rng.standard_normal((size, size), dtype=np.float32))
    w = backend.from_numpy(rng.standard_normal((size, size), dtype=np.float32), weight=True)
    out = backend.linear(x, w)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = backend.linear(x, w)
        backend.to_numpy(out[:1, :1])
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / best
