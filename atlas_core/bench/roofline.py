"""Roofline arithmetic for ``atlas bench``, kept in one place.

Two ceilings bound every figure the benchmarks print:

* Memory bandwidth. Each forward step reads every weight once (`WeightTraffic.bytes_per_step`),
  whatever the batch, so decode at batch N is at most ``N * bandwidth / bytes_per_step`` tokens/s.
  KV-cache reads are left out (small at short context), so this is an upper bound.
* Compute. Each token through the decoder costs ``2 * body_params`` FLOPs and each sampled row
  ``2 * head_params`` more for the lm_head (the engine computes logits only for rows it samples);
  attention FLOPs are left out, which again keeps the bound an upper bound on speed.

Bandwidth is measured as a large array copy on the backend (read + write bytes / time) and compute
as a square matrix product through ``backend.linear``; both can be given instead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

# Precomputed tables that are attributes of the model but not weights: a step reads a few rows.
NON_WEIGHT_ATTRIBUTES = frozenset({"rope_cos", "rope_sin", "cos", "sin", "inv_freq"})


@dataclass(frozen=True)
class WeightTraffic:
    """What one forward step of ``model`` reads and computes.

    ``total_bytes``: every distinct weight array reachable from the model, each counted once.
    ``bytes_per_step``: the same minus the embedding table (a step gathers a few rows of it),
    unless it is tied to the lm_head, which reads it in full.
    ``body_params`` / ``head_params``: elements of the matrices (2-D or more) a token is multiplied
    by in the decoder / in the lm_head.
    """

    total_bytes: int
    bytes_per_step: int
    embedding_bytes: int
    tied_embeddings: bool
    body_params: int
    head_params: int
    dtypes: dict[str, int]  # stored dtype -> bytes

    def flops(self, body_tokens: int, sampled_rows: int) -> float:
        """Matrix-product FLOPs of ``body_tokens`` tokens through the decoder, ``sampled_rows`` through the lm_head."""
        return 2.0 * self.body_params * body_tokens + 2.0 * self.head_params * sampled_rows


def model_weights(model: Any, max_depth: int = 6) -> dict[int, Any]:
    """Every distinct array reachable from ``model`` through attributes, lists, tuples and dicts."""
    seen: dict[int, Any] = {}
    visited: set[int] = set()

    def walk(value: Any, depth: int) -> None:
        if hasattr(value, "nbytes") and hasattr(value, "shape"):
            seen.setdefault(id(value), value)
            return
        if depth >= max_depth or id(value) in visited:
            return
        visited.add(id(value))
        if isinstance(value, (list, tuple)):
            items: Any = value
        elif isinstance(value, dict):
            items = value.values()
        elif hasattr(value, "__dict__"):
            items = [item for name, item in vars(value).items() if name not in NON_WEIGHT_ATTRIBUTES and name != "backend"]
        else:
            return
        for item in items:
            walk(item, depth + 1)

    walk(model, 0)
    return seen


def weight_traffic(model: Any) -> WeightTraffic:
    weights = model_weights(model)
    embed, head = model.embed_tokens, model.lm_head
    tied = head is embed
    total = sum(int(w.nbytes) for w in weights.values())
    dtypes: dict[str, int] = {}
    for w in weights.values():
        dtypes[str(w.dtype)] = dtypes.get(str(w.dtype), 0) + int(w.nbytes)
    matrices = [w for w in weights.values() if len(w.shape) >= 2 and w is not embed and w is not head]
    return WeightTraffic(
        total_bytes=total,
        bytes_per_step=total - (0 if tied else int(embed.nbytes)),
        embedding_bytes=int(embed.nbytes),
        tied_embeddings=tied,
        body_params=sum(int(np.prod(w.shape)) for w in matrices),
        head_params=int(np.prod(head.shape)),
        dtypes=dtypes,
    )


def decode_roofline(bandwidth: float, traffic: WeightTraffic, batch: int) -> float:
    """Aggregate tokens/s of decode at ``batch`` sequences if every step only streamed the weights."""
    return batch * bandwidth / traffic.bytes_per_step


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
