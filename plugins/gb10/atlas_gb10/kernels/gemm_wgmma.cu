// out[M, N] = x[M, K] @ w[N, K]^T (+ bias[N]) for prefill-sized dense products on Hopper (sm_90a): operands
// brought into shared memory by the TMA unit, multiplied by warpgroup tensor-core instructions (wgmma). The gated
// kernels also apply a feed-forward's gate in their epilogue: w is [2N, K] = [gate | up] (bias [2N]) and
// out[M, N] = act(x w_gate^T + b_gate) * (x w_up^T + b_up), each product rounded to bf16 first, as the
// unfused product followed by elementwise.cu's gated kernel computes it (the same bits).
//
// A persistent block of three warpgroups (one an SM) takes the 128 x 128 output tiles (128 x 64 gated)
// blockIdx.x, + gridDim.x, ..., in groups of WG_GROUP_M row tiles (the row tile fastest within a group) so that
// the blocks resident together share their weight tiles in L2 even when the weight does not fit it. Warpgroup 0
// produces: one thread fills WG_STAGES shared-memory stages, each a 128 x 64 tile of x and a 128 x 64 tile of w
// (gated: 64 gate rows, then the 64 up rows of the same units), through two tensor maps (atlas_gb10.tensor_maps:
// zeros past M, N and K, in the 128-byte swizzled layout wgmma reads: row r's 16-byte chunk c at
// r * 128 + ((c ^ (r % 8)) * 16), tiles 1024-byte aligned); a stage's full barrier completes when its bytes have
// landed. Warpgroups 1 and 2 take the block's tiles in turn (ping-pong): each multiplies its whole tile with two
// m64n128k16 steps a 16-deep slice, a stage at a time, and frees a stage (its empty barrier, one arrival a warp)
// once the wgmma group that read it has retired (wgmma.wait_group 1: one group stays in flight). Their main loops
// run one after the other (an order barrier each), so one warpgroup stores its tile while the other keeps the
// tensor cores busy; the producer gives its registers up to their 128 accumulators a thread.
//
// Each output element sums its K tiles in order, so a row's result depends on its x row, w and K only (not on M
// or where the row sits); it is not the bits of gemm.cu's batch-invariant product. Requires K % 8 == 0 and
// 16-byte aligned rows (the host checks).
#include "activations.cuh"
#include "wgmma.cuh"

#define WG_BM 128
#define WG_BN 128
#define WG_BK 64
#define WG_STAGES 6
#define WG_GROUP_M 8
#define WG_STAGE_BYTES ((WG_BM + WG_BN) * WG_BK * 2)

// The dynamic shared memory of a block: the stages, a full and an empty barrier a stage, the two order barriers,
// and the alignment slack.
extern "C" __device__ int gemm_wgmma_shared_bytes[1] = {WG_STAGES * WG_STAGE_BYTES + (2 * WG_STAGES + 2) * 8 + 1024};

// A CUtensorMap (cuda.h), made on the host by cuTensorMapEncodeTiled (atlas_gb10.tensor_maps) and passed by value.
struct alignas(64) TensorMap {
    unsigned long long opaque[16];
};

// The plain product's epilogue (no gate): every accumulator is an output column.
struct NoGate {};

// Whether a product's epilogue gates (Silu, GeluTanh from activations.cuh) or not (NoGate).
template <typename Gate>
struct Gated {
    static constexpr bool value = true;
};
template <>
struct Gated<NoGate> {
    static constexpr bool value = false;
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Output columns a tile covers: WG_BN, or half of them when a gate pairs its columns with the up ones.
template <typename Gate>
__host__ __device__ constexpr int tile_columns() {
    return Gated<Gate>::value ? WG_BN / 2 : WG_BN;
}

// d (the 128 x 128 tile of this warpgroup, rows 64h .. 64h + 63 in d[h]) += the 128 x 64 A tile at shared address
// a_tile times the 128 x 64 B tile at b_tile (both swizzled, 1024-byte aligned), issued as one wgmma group; returns
// once at most this group is pending (the one before has retired).
__device__ __forceinline__ void multiply_k_tile(float (&d)[2][16][4], unsigned a_tile, unsigned b_tile) {
    const unsigned long long da = tile_descriptor(a_tile), db = tile_descriptor(b_tile);
    const unsigned long long half = (64 * 128) >> 4;  // the second 64 rows of A, in descriptor units
    fence_operands(d[0]);
    fence_operands(d[1]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < WG_BK / 16; ++kk) {
        wgmma_64x128x16_ss(d[0], da + 2 * kk, db + 2 * kk, 1);
        wgmma_64x128x16_ss(d[1], da + half + 2 * kk, db + 2 * kk, 1);
    }
    wgmma_commit();
    wgmma_wait<1>();
    fence_operands(d[0]);
    fence_operands(d[1]);
}

// Accumulator d[h][j][e] is row 64h + 16 * warp + lane / 4 (+ 8 for e >= 2) and column 8j + 2 (lane % 4) + (e & 1)
// of the warpgroup's tile. The plain product stores (+ bias) columns n0 .. n0 + 127 of out; a gated one has the
// gate of its 64 output columns n0 .. n0 + 63 in j < 8 and their up in j + 8 (w rows N + n0 ..). Pairs of
// columns are stored as one word where the rows allow it; only elements inside M x N are written.
template <typename Gate>
__device__ __forceinline__ void store_tile(const float (&d)[2][16][4], const bf16_t* __restrict__ bias,
                                           bf16_t* __restrict__ out, long long ldo, int m0, int n0, int M, int N,
                                           Gate gate) {
    constexpr bool gated = Gated<Gate>::value;
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
    const bool paired = (ldo & 1) == 0 && ((unsigned long long)out & 3) == 0;
    auto biased = [&](float acc, int index) { return bias ? __fadd_rn(acc, bf16_to_float(bias[index])) : acc; };
    auto rounded = [](float v) { return bf16_to_float(float_to_bf16(v)); };
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int j = 0; j < (gated ? 8 : 16); ++j) {
            const int col = n0 + 8 * j + 2 * (lane & 3);
#pragma unroll
            for (int r8 = 0; r8 < 2; ++r8) {
                const int r = m0 + 64 * h + 16 * warp + (lane >> 2) + 8 * r8;
                if (r >= M) continue;
                unsigned short v[2] = {0, 0};
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int c = col + e;
                    if (c >= N) continue;
                    const float acc = d[h][j][2 * r8 + e];
                    if constexpr (gated) {
                        const float up = d[h][j + 8][2 * r8 + e];
                        v[e] = float_to_bf16(gate(rounded(biased(acc, c))) * rounded(biased(up, N + c)));
                    } else {
                        v[e] = float_to_bf16(biased(acc, c));
                    }
                }
                bf16_t* p = out + (long long)r * ldo + col;
                if (paired && col + 1 < N) {
                    *reinterpret_cast<unsigned*>(p) = (unsigned)v[0] | ((unsigned)v[1] << 16);
                } else {
                    if (col < N) p[0] = v[0];
                    if (col + 1 < N) p[1] = v[1];
                }
            }
        }
}

// The first row and output column of tile `tile` of an M x N output in grouped order: WG_GROUP_M row tiles a
// group, the row tile fastest; tiles COLUMNS output columns wide.
template <int COLUMNS>
__device__ __forceinline__ void tile_origin(int tile, int M, int N, int& m0, int& n0) {
    const int tiles_m = (M + WG_BM - 1) / WG_BM, tiles_n = (N + COLUMNS - 1) / COLUMNS;
    const int per_group = WG_GROUP_M * tiles_n, first_m = tile / per_group * WG_GROUP_M;
    const int group_rows = min(tiles_m - first_m, WG_GROUP_M), in_group = tile % per_group;
    m0 = (first_m + in_group % group_rows) * WG_BM;
    n0 = in_group / group_rows * COLUMNS;
}

__device__ __forceinline__ void barrier_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}

// One arrival that also expects `bytes` of asynchronous copies to complete on the barrier's current phase.
__device__ __forceinline__ void barrier_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void barrier_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Waits until the barrier's phase of parity `parity` has completed (at once for the phase before a fresh
// barrier's first: parity 1).
__device__ __forceinline__ void barrier_wait(unsigned bar, unsigned parity) {
    unsigned done = 0;
    while (!done) {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    }
}

// The box of `map` at (column c0, row c1) into shared memory at `dst` (zeros outside the tensor), completing on
// barrier `bar`.
__device__ __forceinline__ void tma_load(unsigned dst, const TensorMap& map, unsigned bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
        :
        : "r"(dst), "l"(reinterpret_cast<unsigned long long>(&map)), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}

// The block's tiles (see the top of this file): tile i of the block (blockIdx.x + i * gridDim.x) is multiplied
// by consumer warpgroup i % 2 and read from steps i * k_tiles .. (i + 1) * k_tiles - 1 of the ring (step q in
// stage q % WG_STAGES).
template <typename Gate>
__device__ __forceinline__ void wgmma_product(const TensorMap& x_map, const TensorMap& w_map,
                                              const bf16_t* __restrict__ bias, bf16_t* __restrict__ out, long long ldo,
                                              int M, int N, int K, Gate gate) {
    constexpr int COLUMNS = tile_columns<Gate>();
    extern __shared__ unsigned char wg_smem[];
    const unsigned base = ((unsigned)__cvta_generic_to_shared(wg_smem) + 1023u) & ~1023u;
    const unsigned bars = base + WG_STAGES * WG_STAGE_BYTES;
    auto full = [&](int s) { return bars + 8 * s; };
    auto empty = [&](int s) { return bars + 8 * (WG_STAGES + s); };
    auto order = [&](int consumer) { return bars + 8 * (2 * WG_STAGES + consumer); };
    auto stage_a = [&](int s) { return base + s * WG_STAGE_BYTES; };
    auto stage_b = [&](int s) { return base + s * WG_STAGE_BYTES + WG_BM * WG_BK * 2; };
    if (threadIdx.x == 0) {
        for (int s = 0; s < WG_STAGES; ++s) {
            barrier_init(full(s), 1);
            barrier_init(empty(s), 4);
        }
        barrier_init(order(0), 1);
        barrier_init(order(1), 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const int tiles = ((M + WG_BM - 1) / WG_BM) * ((N + COLUMNS - 1) / COLUMNS), k_tiles = (K + WG_BK - 1) / WG_BK;
    const int warpgroup = threadIdx.x >> 7;
    if (warpgroup == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (threadIdx.x != 0) return;
        int step = 0;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            int m0, n0;
            tile_origin<COLUMNS>(tile, M, N, m0, n0);
            for (int t = 0; t < k_tiles; ++t, ++step) {
                const int s = step % WG_STAGES;
                barrier_wait(empty(s), ((step / WG_STAGES) & 1) ^ 1);
                barrier_expect(full(s), WG_STAGE_BYTES);
                tma_load(stage_a(s), x_map, full(s), t * WG_BK, m0);
                tma_load(stage_b(s), w_map, full(s), t * WG_BK, n0);  // gated: the gate rows of the tile's units
                if constexpr (Gated<Gate>::value)                     // then the up rows of the same units
                    tma_load(stage_b(s) + COLUMNS * 128, w_map, full(s), t * WG_BK, N + n0);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int lane = threadIdx.x & 31, consumer = warpgroup - 1;
    const bool leader = (threadIdx.x & 127) == 0;
    for (int i = consumer, tile = blockIdx.x + consumer * gridDim.x; tile < tiles; i += 2, tile += 2 * gridDim.x) {
        int m0, n0;
        tile_origin<COLUMNS>(tile, M, N, m0, n0);
        // the other consumer's main loop of tile i - 1 (its (i - 1) / 2-th) has been issued (by its first warp: the
        // order only paces the tensor cores; the full and empty barriers guard the data)
        if (i > 0) barrier_wait(order(consumer ^ 1), ((i - 1) / 2) & 1);
        float d[2][16][4];
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int j = 0; j < 16; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) d[h][j][e] = 0.0f;
        int step = i * k_tiles;
        for (int t = 0; t < k_tiles; ++t, ++step) {
            const int s = step % WG_STAGES;
            barrier_wait(full(s), (step / WG_STAGES) & 1);
            multiply_k_tile(d, stage_a(s), stage_b(s));
            if (t > 0 && lane == 0) barrier_arrive(empty((step - 1) % WG_STAGES));
        }
        if (leader) barrier_arrive(order(consumer));
        wgmma_wait<0>();
        fence_operands(d[0]);
        fence_operands(d[1]);
        if (lane == 0 && k_tiles > 0) barrier_arrive(empty((step - 1) % WG_STAGES));
        store_tile(d, bias, out, ldo, m0, n0, M, N, gate);
    }
}

#endif

// A persistent grid of at most one block an SM, 384 threads, gemm_wgmma_shared_bytes of shared memory; x_map reads
// x [M, K] in boxes of 64 columns x 128 rows, w_map w in boxes of 64 x 128 (64 x 64 for the gated kernels), both
// with the 128-byte swizzle. N is out's width (the gated kernels' w has 2N rows).
#define GEMM_WGMMA_KERNEL(NAME, GATE)                                                                                   \
    extern "C" __global__ void __launch_bounds__(384, 1)                                                               \
        NAME(const __grid_constant__ TensorMap x_map, const __grid_constant__ TensorMap w_map,                         \
             const bf16_t* __restrict__ bias, bf16_t* __restrict__ out, long long ldo, int M, int N, int K) {          \
        await_inputs();                                                                                                \
        WGMMA_PRODUCT(GATE)                                                                                            \
    }
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WGMMA_PRODUCT(GATE) wgmma_product(x_map, w_map, bias, out, ldo, M, N, K, GATE);
#else
#define WGMMA_PRODUCT(GATE) __trap();
#endif

GEMM_WGMMA_KERNEL(gemm_wgmma_bf16, NoGate{})
GEMM_WGMMA_KERNEL(gemm_wgmma_silu_mul_bf16, Silu{})
GEMM_WGMMA_KERNEL(gemm_wgmma_gelu_tanh_mul_bf16, GeluTanh{})
