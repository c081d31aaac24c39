// out[M, N] = x[M, K] @ w[N, K]^T (+ bias[N]) for prefill-sized dense products on Hopper's warpgroup tensor-core
// instructions (wgmma, sm_90a): (64 * WARPGROUPS) x 256 output tiles, each of the block's warpgroups computing
// 64 x 256 with m64n256k16 steps whose operands both come from shared memory. Taller tiles read fewer operand
// bytes per product from L2, which bounds this kernel (three warpgroups: 110 flops a byte, two: 85).
//
// Blocks run in groups of WG_GROUP_M row tiles (the row tile varies fastest within a group), so that the blocks
// resident together share their weight tiles in L2 even when the weight does not fit it.
//
// K runs in 64-wide tiles through WG_STAGES shared-memory stages filled with cp.async (16 bytes a thread a copy,
// zeros past M, N and K) in the 128-byte swizzled layout wgmma reads: row r's 16-byte chunk c of a tile lands at
// r * 128 + ((c ^ (r % 8)) * 16), the tile 1024-byte aligned. Two tiles are in flight while the warpgroups
// multiply a third and the wgmma of the tile before may still run (wgmma.wait_group 1): a stage is refilled only
// after every warpgroup has passed the wait that retired its last reader. Each output element sums its K tiles in
// order, so a row's result depends on its x row, w and K only (not on M or where the row sits); it is not the
// bits of gemm.cu's batch-invariant product. Requires K % 8 == 0 and 16-byte aligned rows (the host checks).
#include "common.cuh"

#define WG_BN 256
#define WG_BK 64
#define WG_STAGES 4
#define WG_GROUP_M 8
#define WG_B_BYTES (WG_BN * WG_BK * 2)

// The dynamic shared memory of a block of W warpgroups: the stages, and slack to align them to 1024 bytes.
#define WG_SHARED_BYTES(W) (WG_STAGES * (64 * (W) * WG_BK * 2 + WG_B_BYTES) + 1024)
extern "C" __device__ int gemm_wgmma_shared_bytes[2] = {WG_SHARED_BYTES(2), WG_SHARED_BYTES(3)};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

// 16 bytes from global memory to shared memory, asynchronously; src_bytes 0 fills zeros.
__device__ __forceinline__ void copy16(unsigned smem, const void* global, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(global), "r"(src_bytes));
}

// The wgmma descriptor of a K-major operand tile at shared address `smem` (1024-byte aligned), 128-byte swizzle:
// start address >> 4, leading byte offset 1 (unused by swizzled K-major tiles), 1024 bytes between 8-row groups.
__device__ __forceinline__ unsigned long long tile_descriptor(unsigned smem) {
    return (unsigned long long)((smem & 0x3ffff) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) |
           (1ull << 62);
}

// Rows [0, rows) of a 64-wide K tile at k0 of the [*, K] matrix `src` (row stride ld, rows past `limit` zeros) into
// the swizzled tile at shared address `tile`: chunk i of the tile is thread i's, i + THREADS the next, ...
template <int ROWS, int THREADS>
__device__ __forceinline__ void load_tile(unsigned tile, const bf16_t* __restrict__ src, long long ld, int row0,
                                          int limit, int k0, int K) {
#pragma unroll
    for (int i = threadIdx.x; i < ROWS * 8; i += THREADS) {
        const int r = i >> 3, c = i & 7, k = k0 + c * 8;
        const bool inside = row0 + r < limit && k < K;
        const bf16_t* p = inside ? src + (long long)(row0 + r) * ld + k : src;
        copy16(tile + r * 128 + ((c ^ (r & 7)) << 4), p, inside ? 16 : 0);
    }
}

// d (this thread's 128 accumulators of a 64 x 256 tile) += A (64 x 16) B (16 x 256), or = with accumulate 0.
__device__ __forceinline__ void wgmma_64x256x16(float (&d)[128], unsigned long long desc_a, unsigned long long desc_b,
                                                int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

__device__ __forceinline__ void fence_operands(float (&d)[128]) {
#pragma unroll
    for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

template <int WARPGROUPS>
__device__ __forceinline__ void wgmma_product(const bf16_t* __restrict__ x, long long ldx, const bf16_t* __restrict__ w,
                                              const bf16_t* __restrict__ bias, bf16_t* __restrict__ out, long long ldo,
                                              int M, int N, int K) {
    constexpr int BM = 64 * WARPGROUPS, THREADS = 128 * WARPGROUPS, A_BYTES = BM * WG_BK * 2;
    constexpr int STAGE_BYTES = A_BYTES + WG_B_BYTES;
    extern __shared__ unsigned char wg_smem[];
    const unsigned base = ((unsigned)__cvta_generic_to_shared(wg_smem) + 1023u) & ~1023u;
    // grouped order: WG_GROUP_M row tiles a group, the row tile fastest
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + WG_BN - 1) / WG_BN;
    const int per_group = WG_GROUP_M * tiles_n, first_m = (int)(blockIdx.x / per_group) * WG_GROUP_M;
    const int group_rows = min(tiles_m - first_m, WG_GROUP_M), in_group = (int)(blockIdx.x % per_group);
    const int m0 = (first_m + in_group % group_rows) * BM, n0 = (in_group / group_rows) * WG_BN;
    const int warpgroup = threadIdx.x >> 7, tiles = (K + WG_BK - 1) / WG_BK;
    auto stage_a = [&](int s) { return base + s * STAGE_BYTES; };
    auto stage_b = [&](int s) { return base + s * STAGE_BYTES + A_BYTES; };
    auto load = [&](int t) {
        if (t < tiles) {
            load_tile<BM, THREADS>(stage_a(t % WG_STAGES), x, ldx, m0, M, t * WG_BK, K);
            load_tile<WG_BN, THREADS>(stage_b(t % WG_STAGES), w, K, n0, N, t * WG_BK, K);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    float d[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) d[i] = 0.0f;
#pragma unroll
    for (int t = 0; t < WG_STAGES - 2; ++t) load(t);
    for (int t = 0; t < tiles; ++t) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(WG_STAGES - 3));
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();  // tile t is in place; every warpgroup has retired the wgmma of tile t - 2
        load(t + WG_STAGES - 2);
        const unsigned long long da = tile_descriptor(stage_a(t % WG_STAGES) + warpgroup * 64 * 128);
        const unsigned long long db = tile_descriptor(stage_b(t % WG_STAGES));
        fence_operands(d);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < WG_BK / 16; ++kk) wgmma_64x256x16(d, da + 2 * kk, db + 2 * kk, 1);
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        fence_operands(d);
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    fence_operands(d);
    // d[4j + e]: row 16 * warp + lane / 4 (+ 8 for e >= 2), column 8j + 2 (lane % 4) + (e & 1) of the warpgroup's
    // tile; the two columns of a pair are stored as one word where the rows allow it
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
    const int row = m0 + warpgroup * 64 + warp * 16 + (lane >> 2);
    const bool paired = (ldo & 1) == 0 && ((unsigned long long)out & 3) == 0;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
        const int col = n0 + 8 * j + 2 * (lane & 3);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = row + 8 * h;
            if (r >= M) continue;
            float v[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int c = col + e;
                v[e] = d[4 * j + 2 * h + e];
                if (bias && c < N) v[e] = __fadd_rn(v[e], bf16_to_float(bias[c]));
            }
            bf16_t* p = out + (long long)r * ldo + col;
            if (paired && col + 1 < N) {
                *reinterpret_cast<unsigned*>(p) = (unsigned)float_to_bf16(v[0]) | ((unsigned)float_to_bf16(v[1]) << 16);
            } else {
                if (col < N) p[0] = float_to_bf16(v[0]);
                if (col + 1 < N) p[1] = float_to_bf16(v[1]);
            }
        }
    }
}

#endif

// A block of W warpgroups computes one (64 W) x 256 tile; the grid is one-dimensional, tiles_m * tiles_n blocks.
#define GEMM_WGMMA_KERNEL(W)                                                                                          \
    extern "C" __global__ void __launch_bounds__(128 * W, 1)                                                          \
        gemm_wgmma_w##W##_bf16(const bf16_t* __restrict__ x, long long ldx, const bf16_t* __restrict__ w,            \
                               const bf16_t* __restrict__ bias, bf16_t* __restrict__ out, long long ldo, int M, int N, \
                               int K) {                                                                               \
        await_inputs();                                                                                               \
        WGMMA_BODY(W)                                                                                                 \
    }
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WGMMA_BODY(W) wgmma_product<W>(x, ldx, w, bias, out, ldo, M, N, K);
#else
#define WGMMA_BODY(W) __trap();
#endif
GEMM_WGMMA_KERNEL(2)
GEMM_WGMMA_KERNEL(3)
