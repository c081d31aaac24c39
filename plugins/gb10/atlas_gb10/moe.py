"""The ``moe`` op group on CUDA (kernels in ``kernels/moe.cu``).

``moe_route`` is one kernel (a warp per token). ``moe_experts`` runs the selected experts as grouped
GEMMs over the (token, slot) pairs:

    plan:     counts per expert -> each m-tile's expert and rows, each pair's row, each row's token
    gate/up:  h[r] = x[token(r)] @ w_in[e]^T        (grouped GEMM, rows gathered by token; relu2 applied
              in its epilogue)
    act:      silu / gelu_tanh of [gate | up]       (the backend's gated products)
    down:     y[r] = h[r] @ w_out[e]^T              (grouped GEMM)
    combine:  out[t] = sum_j weights[t, j] * y[row(t, j)]   (slot order, fp32)

A single token (batch-1 decode) skips the plan: its k experts are distinct, so a block per pair and
column tile reading the pair's expert straight from ``ids`` reads what the grouped products would, one
launch sooner, and y's row of pair p is p. Larger batches group the pairs by expert on the device, so
each active expert's weights are read once per m-tile of its tokens (a block per pair would read an
expert that tokens share once per pair: measured slower from 2 tokens up on an H100). Launch sizes
depend only on T, k and E, so decode steps capture into CUDA graphs. A product row's value depends only
on its own input row (fixed K order, `gemm_core.cuh`), so a token's output is the same whatever else is
in the batch, wherever the plan puts its rows and whether the plan runs at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from atlas_core.backends.base import Array
from atlas_core.backends.ops.moe import ExpertActivation, MoEOps, RouterSpec, check_expert_shapes
from atlas_core.weights.quantized import QuantizedWeight
from atlas_gb10.arrays import loads_16_bytes, null_or
from atlas_gb10.backend import CudaBackend
from atlas_gb10.gemm_shapes import TILED_GEMM_BLOCK, tiled_shared_bytes
from atlas_gb10.quantized_weights import gemm_loads, gemm_module, weight_operand

ROUTE_WARPS = 4
"""Tokens routed per block (a warp each)."""
MAX_ROUTED_EXPERTS = 1024
"""The most experts `moe_route` and the plan take (a 32-bit mask per lane; one plan thread each)."""
MAX_TOP_K = 32
"""The most experts per token (one lane per selected slot)."""
TILED_ROWS = 64
"""The m-tile of the tiled expert products (`moe_gemm_tiled`, prefill-sized groups outside the batch-invariant
mode)."""
TILED_MIN_PAIRS_PER_SM = 32
"""(token, expert) pairs per SM from which the tiled expert products are used."""


@dataclass(frozen=True)
class _Groups:
    """Which rows each block of the expert products computes: the m-tiles of `moe_plan` (``tiles[3, blocks]``,
    with each pair's row and each row's token), or, with those three None, a block per pair of ``ids``
    (a single token). ``tile_rows``: the most rows a block multiplies (an expert takes a token once, so a plan's
    tile has at most as many rows as there are tokens)."""

    ids: Array
    blocks: int
    tiles: Array | None = None
    pair_rows: Array | None = None
    row_tokens: Array | None = None
    tile_rows: int = 1


class CudaMoEOps(MoEOps):
    """`MoEOps` with every op a CUDA kernel; inputs and outputs stay on the device."""

    backend: CudaBackend

    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        self.cp = backend.cp

    def _kernel(self, name: str) -> Any:
        return self.backend.kernels.function("moe", name)

    def moe_route(
        self, router_logits: Array, spec: RouterSpec, correction_bias: Array | None = None
    ) -> tuple[Array, Array]:
        cp, backend = self.cp, self.backend
        tokens, experts = router_logits.shape
        if experts != spec.num_experts:
            raise ValueError(f"moe_route: router logits have {experts} experts, the RouterSpec says {spec.num_experts}")
        if experts > MAX_ROUTED_EXPERTS or spec.top_k > MAX_TOP_K:
            return super().moe_route(router_logits, spec, correction_bias)
        backend.require_bf16("moe_route", router_logits)
        logits = backend.contiguous_rows(router_logits)
        weights = cp.empty((tokens, spec.top_k), dtype=np.float32)
        ids = cp.empty((tokens, spec.top_k), dtype=np.int32)
        if tokens:
            bias = None if correction_bias is None else correction_bias.astype(np.float32, copy=False)
            self._kernel("moe_route")(
                (math.ceil(tokens / ROUTE_WARPS),),
                (32 * ROUTE_WARPS,),
                (
                    logits,
                    np.int64(logits.strides[0] // logits.itemsize),
                    null_or(bias),
                    weights,
                    ids,
                    np.int32(tokens),
                    np.int32(experts),
                    np.int32(spec.top_k),
                    np.int32(spec.scoring == "sigmoid"),
                    np.int32(spec.num_groups),
                    np.int32(spec.top_k_groups),
                    np.int32(spec.normalize_top_k),
                    np.float32(spec.routed_scaling_factor),
                ),
                shared_mem=ROUTE_WARPS * 2 * experts * 4,
            )
        return weights, ids

    def moe_experts(
        self,
        x: Array,
        w_in: Array | QuantizedWeight,
        w_out: Array | QuantizedWeight,
        weights: Array,
        ids: Array,
        activation: ExpertActivation,
    ) -> Array:
        check_expert_shapes(tuple(w_in.shape), tuple(w_out.shape), activation)
        cp, backend = self.cp, self.backend
        experts, in_rows, hidden = w_in.shape
        tokens, top_k = ids.shape
        if experts > MAX_ROUTED_EXPERTS:
            return super().moe_experts(x, w_in, w_out, weights, ids, activation)
        backend.require_bf16("moe_experts", x, *(w for w in (w_in, w_out) if not isinstance(w, QuantizedWeight)))
        x = backend.contiguous_rows(x)
        out = cp.empty((tokens, hidden), dtype=x.dtype)
        pairs = tokens * top_k
        if pairs == 0:
            return out
        m_tiles, n_tiles_in, n_tiles_out = self._tiles(pairs)
        ids = cp.ascontiguousarray(ids, dtype=np.int32)
        tiled = self._tiled_pays(pairs, w_in, w_out, hidden, in_rows if activation == "relu2" else in_rows // 2)
        if tiled:
            m_tiles = 0
        groups = _Groups(ids, pairs) if tokens == 1 else self._plan(ids, experts, TILED_ROWS if tiled else 16 * m_tiles)
        gate_up = cp.empty((pairs, in_rows), dtype=x.dtype)
        relu2 = activation == "relu2"
        self._grouped_gemm(x, groups.row_tokens, top_k, w_in, gate_up, groups, m_tiles, n_tiles_in, relu2)
        if relu2:
            hidden_rows = gate_up
        elif activation == "silu":
            hidden_rows = backend.silu_mul(gate_up)
        else:
            hidden_rows = backend.gelu_tanh_mul(gate_up)
        expert_out = cp.empty((pairs, hidden), dtype=x.dtype)
        self._grouped_gemm(hidden_rows, None, 1, w_out, expert_out, groups, m_tiles, n_tiles_out, False)
        self._kernel("moe_combine")(
            (math.ceil(hidden / 256), tokens),
            (256,),
            (
                expert_out,
                np.int64(hidden),
                null_or(groups.pair_rows),
                ids,
                np.int32(experts),
                cp.ascontiguousarray(weights, dtype=np.float32),
                out,
                np.int64(hidden),
                np.int32(top_k),
                np.int32(hidden),
            ),
        )
        return out

    def _plan(self, ids: Array, experts: int, tile_rows: int) -> _Groups:
        """Group the pairs of ``ids[T, k]`` by expert (`moe_plan`) into m-tiles of ``tile_rows`` rows."""
        cp = self.cp
        pairs = int(ids.size)
        max_tiles = math.ceil(pairs / tile_rows) + min(experts, pairs)  # each active expert's last tile may be partial
        groups = _Groups(
            ids,
            max_tiles,
            cp.empty((3, max_tiles), dtype=np.int32),
            cp.empty(pairs, dtype=np.int32),
            cp.empty(pairs, dtype=np.int32),
            min(tile_rows, int(ids.shape[0])),
        )
        self._kernel("moe_plan")(
            (1,),
            (MAX_ROUTED_EXPERTS,),
            (
                ids,
                np.int32(pairs),
                np.int32(ids.shape[1]),
                np.int32(experts),
                np.int32(tile_rows),
                np.int32(max_tiles),
                groups.tiles,
                groups.pair_rows,
                groups.row_tokens,
            ),
        )
        return groups

    def _tiled_pays(
        self, pairs: int, w_in: Array | QuantizedWeight, w_out: Array | QuantizedWeight, hidden: int, inner: int
    ) -> bool:
        """Prefill-sized groups of bf16 experts outside the batch-invariant mode (both products' K a multiple
        of 8, the weights 16-byte aligned) take `moe_gemm_tiled`."""
        return (
            not self.backend.batch_invariant
            and pairs >= TILED_MIN_PAIRS_PER_SM * self.backend.profile.sm_count
            and not isinstance(w_in, QuantizedWeight)
            and not isinstance(w_out, QuantizedWeight)
            and hidden % 8 == 0
            and inner % 8 == 0
            and w_in.data.ptr % 16 == 0
            and w_out.data.ptr % 16 == 0
        )

    def _tiles(self, pairs: int) -> tuple[int, int, int]:
        """(m-tiles of 16 rows, n-tiles of 8 columns for gate/up, for down) per block. The m-tile is shared
        by both products (the plan cuts the groups into tiles of that many rows). Measured on an H100
        (scripts/moe_tiles.py, 128 and 512 experts of width 768 and 512): decode-sized groups stream
        weights fastest with one m-tile and 2 (a few tokens) or 4 n-tiles per block, 1.5x to 1.9x the
        narrowest tile; prefill-sized ones take the largest tile. The result is the same for any tile."""
        if pairs <= 32:
            return 1, 2, 4
        if pairs <= 16 * self.backend.profile.sm_count:
            return 1, 4, 4
        return 2, 4, 4

    def _grouped_gemm(
        self,
        x: Array,
        x_rows: Array | None,
        pairs_per_row: int,
        w: Array | QuantizedWeight,
        out: Array,
        groups: _Groups,
        m_tiles: int,
        n_tiles: int,
        relu2: bool,
    ) -> None:
        """``out[r] = x[row(r)] @ w[expert(r)]^T`` (``max(., 0)^2`` of it with ``relu2``) for every row r
        (`moe_gemm_*`, or `moe_gemm_fp8_*` / `moe_gemm_nvfp4_*` over a quantized bank; ``m_tiles`` 0:
        `moe_gemm_tiled` over a plan of `TILED_ROWS`-row tiles): over the m-tiles of `_plan` (row(r) =
        ``x_rows[r]`` or r), or a block per pair without a plan (row(p) = p // ``pairs_per_row``, the expert
        ``ids[p]``)."""
        experts, n, k = w.shape
        ldx = x.strides[0] // x.itemsize
        if m_tiles == 0:
            kernel = self._kernel("moe_gemm_tiled")
            smem = tiled_shared_bytes(TILED_ROWS)
            kernel.max_dynamic_shared_size_bytes = smem
            args = (x, np.int64(ldx), null_or(x_rows), w, out, np.int64(out.strides[0] // out.itemsize))
            grid = (math.ceil(n / TILED_GEMM_BLOCK), groups.blocks)
            plan = (groups.tiles, np.int32(groups.blocks), np.int32(experts), np.int32(n), np.int32(k), np.int32(relu2))
            kernel(grid, (256,), (*args, *plan), shared_mem=smem)
            return
        kind, weight_args, weight_aligned = weight_operand(w)
        vec = loads_16_bytes(x, ldx, k, weight_aligned)
        prefix = "moe_gemm" if kind == "bf16" else f"moe_gemm_{kind}"
        name = f"{prefix}_m{m_tiles}_n{n_tiles}_{gemm_loads(kind, vec, groups.tile_rows)}"
        kernel = self.backend.kernels.function("moe", name, gemm_module(kind))
        kernel(
            (math.ceil(n / (8 * n_tiles)), groups.blocks),
            (256,),
            (
                x,
                np.int64(ldx),
                null_or(x_rows),
                *weight_args,
                out,
                np.int64(out.strides[0] // out.itemsize),
                null_or(groups.tiles),
                np.int32(groups.blocks),
                groups.ids,
                np.int32(pairs_per_row),
                np.int32(experts),
                np.int32(n),
                np.int32(k),
                np.int32(relu2),
            ),
        )
