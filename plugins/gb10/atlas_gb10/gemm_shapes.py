"""Block shapes of the dense products: gemm.cu's tile for a product (the decode tile model included), and which
prefill kernel takes a prefill-sized product (`prefill_kernel`: gemm_wgmma.cu on Hopper, gemm_tiled.cu) with its
shared memory. Results never depend on the tile (`gemm_core.cuh`: a row's K order is fixed)."""

from __future__ import annotations

import math
from fractions import Fraction

from atlas_gb10.quantized_weights import LOW8_ROWS
from atlas_gb10.registry import GENERIC, lookup

GEMM_TILES = ((2, 4), (1, 4), (1, 2), (1, 1))
"""(m-tiles of 16 rows, n-tiles of 8 columns) per GEMM block, largest first."""
TILED_GEMM_BLOCK = 128
"""gemm_tiled.cu's output tile (rows and columns)."""


WGMMA = "gemm_wgmma"
"""gemm_wgmma.cu's kernel (Hopper): TMA loads, warp-specialised warpgroups, persistent blocks whose two
multiplying warpgroups take `WGMMA_ROWS` x `WGMMA_COLUMNS` tiles in turn."""
WGMMA_ROWS, WGMMA_COLUMNS = 128, 128
"""Rows and columns of a gemm_wgmma.cu tile of products (a gated kernel's tile has half as many output columns)."""
WGMMA_DEPTH = 64
"""K elements of a gemm_wgmma.cu stage (128 bytes: the row of its 128-byte swizzle)."""


def wgmma_tiles(m: int, n: int) -> int:
    """gemm_wgmma.cu's output tiles for an ``[m, n]`` product."""
    return math.ceil(m / WGMMA_ROWS) * math.ceil(n / WGMMA_COLUMNS)


WGMMA_MIN_K, WGMMA_MIN_N = 1024, 1024
"""gemm_wgmma.cu takes products at least this deep and wide: the smallest it was measured on (Qwen3-0.6B's, K
1,024 to 3,072 and N 1,024 to 6,144), where it beat the mma.sync kernels 1.4-2.3x wherever its tiles filled the SMs
(measured with its earlier, cooperative kernel of 128 x 256 tiles; the ping-pong kernel is faster on all of them)."""
GATED_MIN_K = 2048
"""`CudaBackend.gated_linear` fuses the gate into gemm_wgmma.cu's epilogue for products at least this deep: on
Llama-3-8B's gate/up (K 4,096) the fused product is 5-11% faster than the product and the gated kernel; on
Qwen3-0.6B's (K 1,024) each tile's main loop is too short to hide the gate's arithmetic (8,192 rows: 5% slower)."""


def prefill_kernel(m: int, n: int, k: int, sm_count: int, wgmma: bool) -> str | None:
    """The kernel of a prefill-sized ``[m, n]`` bf16 product over ``k`` outside the batch-invariant mode (at least
    256 rows): gemm_wgmma.cu's where the device has wgmma, the product is at least `WGMMA_MIN_K` deep and
    `WGMMA_MIN_N` wide and its 128 x 128 tiles fill at least half the SMs (the cooperative kernel before it was
    faster than the others on every such shape measured, down to 512 x 1024 x 4096; gemm.cu won on 512 x 2048 x
    1024), else ``gemm_tiled`` where its 128 x 128
    tiles give every SM one;
    None: gemm.cu (K split over a block's warps, many blocks for narrow products)."""
    if m < 2 * TILED_GEMM_BLOCK:
        return None
    if wgmma and k >= WGMMA_MIN_K and n >= WGMMA_MIN_N and 2 * wgmma_tiles(m, n) >= sm_count:
        return WGMMA
    if math.ceil(m / TILED_GEMM_BLOCK) * math.ceil(n / TILED_GEMM_BLOCK) >= sm_count:
        return "gemm_tiled"
    return None


def tiled_shared_bytes(rows: int) -> int:
    """gemm_tiled.cuh's shared memory for tiles of ``rows`` x 128: 3 stages of both operands' 32-wide slices, in
    rows padded to 40 bf16."""
    return 3 * (rows + TILED_GEMM_BLOCK) * (32 + 8) * 2


GEMM_KSPLIT = lookup(GENERIC, "gemm", "bf16").define("GEMM_KSPLIT", 8)
"""Warps of a gemm.cu block, each summing its own run of the 32-wide K chunks."""
DECODE_CHUNKS_IN_FLIGHT = 16
"""gemm.cu's decode kernels (one m-tile; 1, 2 or 4 n-tiles) load 16 / n-tiles chunks a warp at a time: a lane
has 16 weight loads in flight when its run of chunks is long enough."""


def decode_n_tiles(n: int, k: int, sm_count: int) -> int:
    """n-tiles per block of a decode-sized bf16 product (gemm.cu's ``m1`` kernels, two blocks an SM): the fewest
    serial rounds of weight loads, a round being one batch of a warp's chunk loop, times the waves of blocks (a
    fraction, at least one); ties go to fewer blocks. Four n-tiles only where their blocks fit one wave (on
    wider products they were never faster). This picks the fastest tile of every decode shape measured on H100
    (K 1,024 to 14,336; docs/benchmarks.md), where one n-tile everywhere lost up to a third on small K (few
    chunks a warp, two waves of blocks)."""
    chunks_per_warp = math.ceil(math.ceil(k / 32) / GEMM_KSPLIT)
    slots = 2 * sm_count

    def blocks(n_tiles: int) -> int:
        return math.ceil(n / (8 * n_tiles))

    def cost(n_tiles: int) -> tuple[Fraction, int]:
        batches = math.ceil(chunks_per_warp / (DECODE_CHUNKS_IN_FLIGHT // n_tiles))
        return batches * max(Fraction(1), Fraction(blocks(n_tiles), slots)), blocks(n_tiles)

    return min((n_tiles for n_tiles in (1, 2, 4) if n_tiles < 4 or blocks(4) <= slots), key=cost)


THREE_BLOCK_KINDS = frozenset({"fp8", "nvfp4", "gguf_q8_0"})
"""The quantized kinds with ``vec8x3`` kernels (gemm.cu): two n-tiles, three blocks an SM."""


def low8_loads(kind: str, n: int, n_tiles: int, sm_count: int) -> str:
    """The suffix of the ``vec8`` kernel for an ``n``-column product of ``n_tiles`` n-tiles a block: ``vec8x3``
    (three blocks an SM, in at most 85 registers a thread) where the blocks number more than two an SM but at most
    three, so that they run in one wave instead of one and a half (an H100, one row: FP8 Llama-3-8B q/k/v 14.4 ->
    12.5 us, Qwen3-30B-A3B q/k/v 8.5 -> 7.0 us); ``vec8`` elsewhere, where it was as fast or faster."""
    blocks = math.ceil(n / (8 * n_tiles))
    if kind in THREE_BLOCK_KINDS and n_tiles == 2 and 2 * sm_count < blocks <= 3 * sm_count:
        return "vec8x3"
    return "vec8"


def gemm_tile(m: int, n: int, k: int, kind: str, sm_count: int) -> tuple[int, int]:
    """gemm.cu's block tile (m-tiles, n-tiles) for an ``[m, n]`` output over ``k`` of weight kind ``kind``.
    Decode-sized bf16 products (m <= 16) take `decode_n_tiles`. The quantized kinds' ``vec8`` kernels (m <= 8) pair
    two n-tiles in each mma step (gemm_core.cuh's swapped fragments), so they take two n-tiles wherever that still
    gives every SM a block; m 9..16, one n-tile, or two for very wide outputs. Larger m takes the largest tile that
    still gives every SM a block."""
    if m <= 16:
        if kind == "bf16":
            return 1, decode_n_tiles(n, k, sm_count)
        if m <= LOW8_ROWS:
            return (1, 2) if n >= 16 * sm_count else (1, 1)
        return (1, 2) if n >= 64 * sm_count else (1, 1)
    for mt, nt in GEMM_TILES:
        if math.ceil(n / (8 * nt)) * math.ceil(m / (16 * mt)) >= sm_count:
            return mt, nt
    return GEMM_TILES[-1]
