"""Launches of the prefill-sized dense products (`gemm_shapes.prefill_kernel`): gemm_tiled.cu, and gemm_wgmma.cu on
Hopper, plain or with a feed-forward's gate in its epilogue (`gated_wgmma_product`); and the decode-sized gated
products of gemm.cu (`gated_decode_product`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from atlas_gb10.arrays import null_or
from atlas_gb10.gemm_shapes import (
    TILED_GEMM_BLOCK,
    WGMMA_COLUMNS,
    WGMMA_DEPTH,
    WGMMA_ROWS,
    tiled_shared_bytes,
    wgmma_tiles,
)
from atlas_gb10.tensor_maps import bf16_rows_map

if TYPE_CHECKING:
    from atlas_core.backends.base import Array
    from atlas_gb10.backend import CudaBackend

GATED_KERNELS = {"silu": "gemm_wgmma_silu_mul_bf16", "gelu_tanh": "gemm_wgmma_gelu_tanh_mul_bf16"}
"""gemm_wgmma.cu's gated kernel of each gate activation (`Backend.gated_linear`)."""
GATED_DECODE_ROWS = 16
"""gemm.cu's gated kernels take products of at most this many rows (one m-tile)."""


def prefill_product(
    backend: CudaBackend,
    name: str,
    x: Array,
    ldx: int,
    weight: Array,
    bias: Array | None,
    out: Array,
    ldo: int,
    m: int,
    n: int,
    k: int,
) -> Array:
    """``out = x weight^T (+ bias)`` through prefill kernel ``name``: ``gemm_tiled``, or gemm_wgmma.cu's (Hopper
    only; its TMA loads need x's address and row stride 16-byte aligned, as every prefill kernel's 16-byte loads
    do)."""
    rest = (null_or(bias), out, np.int64(ldo), np.int32(m), np.int32(n), np.int32(k))
    if name == "gemm_tiled":
        kernel, smem = backend._kernel(name, "gemm_tiled_bf16"), tiled_shared_bytes(TILED_GEMM_BLOCK)
        kernel.max_dynamic_shared_size_bytes = smem
        grid = (math.ceil(n / TILED_GEMM_BLOCK), math.ceil(m / TILED_GEMM_BLOCK))
        kernel(grid, (256,), (x, np.int64(ldx), weight, *rest), shared_mem=smem)
        return out
    maps = _wgmma_maps(x, ldx, weight, m, n, k, WGMMA_COLUMNS)
    _launch_wgmma(backend, "gemm_wgmma_bf16", wgmma_tiles(m, n), (*maps, *rest))
    return out


def gated_wgmma_product(
    backend: CudaBackend, activation: str, x: Array, ldx: int, weight: Array, bias: Array | None, m: int, k: int
) -> Array:
    """``act(gate) * up`` of ``x weight^T (+ bias)``, ``weight`` ``[2I, k]`` = [gate | up], through gemm_wgmma.cu's
    gated kernel of ``activation`` (a key of `GATED_KERNELS`): a new ``[m, I]`` array with the bits of the plain
    product followed by the elementwise gated kernel."""
    inner = weight.shape[0] // 2
    out = backend.cp.empty((m, inner), dtype=weight.dtype)
    maps = _wgmma_maps(x, ldx, weight, m, 2 * inner, k, WGMMA_COLUMNS // 2)
    rest = (null_or(bias), out, np.int64(inner), np.int32(m), np.int32(inner), np.int32(k))
    _launch_wgmma(backend, GATED_KERNELS[activation], wgmma_tiles(m, 2 * inner), (*maps, *rest))
    return out


def _wgmma_maps(x: Array, ldx: int, weight: Array, m: int, n: int, k: int, weight_box_rows: int) -> tuple[Any, Any]:
    """The tensor maps gemm_wgmma.cu reads x ``[m, k]`` and the weight ``[n, k]`` through."""
    x_map = bf16_rows_map(x.data.ptr, m, k, ldx, WGMMA_ROWS, WGMMA_DEPTH)
    w_map = bf16_rows_map(weight.data.ptr, n, k, k, weight_box_rows, WGMMA_DEPTH)
    return x_map, w_map


def _launch_wgmma(backend: CudaBackend, kernel_name: str, tiles: int, args: tuple[Any, ...]) -> None:
    """One persistent gemm_wgmma.cu launch: a block an SM at most, one a tile at least."""
    kernel = backend._kernel("gemm_wgmma", kernel_name)
    smem = backend.kernels.constants("gemm_wgmma", "gemm_wgmma_shared_bytes", 1)[0]
    kernel.max_dynamic_shared_size_bytes = smem
    kernel((min(backend.profile.sm_count, tiles),), (384,), args, shared_mem=smem)


def gated_decode_product(
    backend: CudaBackend, activation: str, x: Array, ldx: int, weight: Array, bias: Array | None, m: int, k: int
) -> Array:
    """``act(gate) * up`` of ``x weight^T (+ bias)`` for at most `GATED_DECODE_ROWS` rows (``k`` a multiple of 8,
    rows 16-byte aligned), ``weight`` ``[2I, k]`` = [gate | up], through gemm.cu's gated kernel of ``activation``: a
    new ``[m, I]`` array with the bits of the product followed by the elementwise gated kernel (gemm.cu computes a
    column the same way in every tile, so also in the batch-invariant mode)."""
    inner = weight.shape[0] // 2
    out = backend.cp.empty((m, inner), dtype=weight.dtype)
    kernel = backend.kernels.function("gemm", f"gemm_bf16_{activation}_mul_m1_n2_vec")
    grid = (math.ceil(inner / 8), math.ceil(m / GATED_DECODE_ROWS))
    args = (x, np.int64(ldx), weight, null_or(bias), out, np.int64(inner), np.int32(m), np.int32(inner), np.int32(k))
    kernel(grid, (256,), args)
    return out
