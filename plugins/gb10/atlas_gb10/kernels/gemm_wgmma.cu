// out[M, N] = x[M, K] @ w[N, K]^T (+ bias[N]) for prefill-sized dense products on Hopper (sm_90a): operands
// brought into shared memory by the TMA unit, multiplied by warpgroup tensor-core instructions (wgmma).
//
// A persistent block of three warpgroups (one an SM) takes the 128 x 256 output tiles blockIdx.x, + gridDim.x, ...,
// in groups of WG_GROUP_M row tiles (the row tile fastest within a group) so that the blocks resident together
// share their weight tiles in L2 even when the weight does not fit it. Warpgroup 0 produces: one thread fills
// WG_STAGES shared-memory stages, each a 128 x 64 tile of x and a 256 x 64 tile of w, through two tensor maps
// (atlas_gb10.tensor_maps: zeros past M, N and K, in the 128-byte swizzled layout wgmma reads: row r's 16-byte
// chunk c at r * 128 + ((c ^ (r % 8)) * 16), tiles 1024-byte aligned); a stage's full barrier completes when its
// bytes have landed. Warpgroups 1 and 2 each multiply 64 rows of the tile by its 256 columns with m64n256k16
// steps, a stage at a time, and free a stage (its empty barrier, one arrival a warp) once the wgmma group that
// read it has retired (wgmma.wait_group 1: one group stays in flight). They store a tile while the producer
// already fills the next one's stages; the producer gives its registers up to their 128 accumulators a thread.
//
// Each output element sums its K tiles in order, so a row's result depends on its x row, w and K only (not on M
// or where the row sits); it is not the bits of gemm.cu's batch-invariant product. Requires K % 8 == 0 and
// 16-byte aligned rows (the host checks).
#include "wgmma.cuh"

#define WG_BM 128
#define WG_BN 256
#define WG_BK 64
#define WG_STAGES 4
#define WG_GROUP_M 8
#define WG_STAGE_BYTES ((WG_BM + WG_BN) * WG_BK * 2)

// The dynamic shared memory of a block: the stages, a full and an empty barrier a stage, and the alignment slack.
extern "C" __device__ int gemm_wgmma_shared_bytes[1] = {WG_STAGES * WG_STAGE_BYTES + 2 * WG_STAGES * 8 + 1024};

// A CUtensorMap (cuda.h), made on the host by cuTensorMapEncodeTiled (atlas_gb10.tensor_maps) and passed by value.
struct alignas(64) TensorMap {
    unsigned long long opaque[16];
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

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

// d += the 64 x 64 A tile at shared address a_tile times the 256 x 64 B tile at b_tile (both swizzled, 1024-byte
// aligned), issued as one wgmma group; returns once at most this group is pending (the one before has retired).
__device__ __forceinline__ void multiply_k_tile(float (&d)[128], unsigned a_tile, unsigned b_tile) {
    const unsigned long long da = tile_descriptor(a_tile), db = tile_descriptor(b_tile);
    fence_operands(d);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < WG_BK / 16; ++kk) wgmma_64x256x16(d, da + 2 * kk, db + 2 * kk, 1);
    wgmma_commit();
    wgmma_wait<1>();
    fence_operands(d);
}

// Stores a warpgroup's 64 x 256 accumulators d (+ bias) as bf16 rows row0 .. row0 + 63, columns n0 .. n0 + 255
// of out (those inside M x N).
__device__ __forceinline__ void store_tile(const float (&d)[128], const bf16_t* __restrict__ bias,
                                           bf16_t* __restrict__ out, long long ldo, int row0, int n0, int M, int N) {
    // d[4j + e]: row 16 * warp + lane / 4 (+ 8 for e >= 2), column 8j + 2 (lane % 4) + (e & 1) of the warpgroup's
    // tile; the two columns of a pair are stored as one word where the rows allow it
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
    const int row = row0 + warp * 16 + (lane >> 2);
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

// The first row and column of output tile `tile` of an M x N output in grouped order: WG_GROUP_M row tiles a group,
// the row tile fastest.
__device__ __forceinline__ void tile_origin(int tile, int M, int N, int& m0, int& n0) {
    const int tiles_m = (M + WG_BM - 1) / WG_BM, tiles_n = (N + WG_BN - 1) / WG_BN;
    const int per_group = WG_GROUP_M * tiles_n, first_m = tile / per_group * WG_GROUP_M;
    const int group_rows = min(tiles_m - first_m, WG_GROUP_M), in_group = tile % per_group;
    m0 = (first_m + in_group % group_rows) * WG_BM;
    n0 = in_group / group_rows * WG_BN;
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

// The block's tiles (see the top of this file).
__device__ __forceinline__ void wgmma_product(const TensorMap& x_map, const TensorMap& w_map,
                                              const bf16_t* __restrict__ bias, bf16_t* __restrict__ out, long long ldo,
                                              int M, int N, int K) {
    extern __shared__ unsigned char wg_smem[];
    const unsigned base = ((unsigned)__cvta_generic_to_shared(wg_smem) + 1023u) & ~1023u;
    const unsigned bars = base + WG_STAGES * WG_STAGE_BYTES;
    auto full = [&](int s) { return bars + 8 * s; };
    auto empty = [&](int s) { return bars + 8 * (WG_STAGES + s); };
    auto stage_a = [&](int s) { return base + s * WG_STAGE_BYTES; };
    auto stage_b = [&](int s) { return base + s * WG_STAGE_BYTES + WG_BM * WG_BK * 2; };
    if (threadIdx.x == 0) {
        for (int s = 0; s < WG_STAGES; ++s) {
            barrier_init(full(s), 1);
            barrier_init(empty(s), 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const int tiles = ((M + WG_BM - 1) / WG_BM) * ((N + WG_BN - 1) / WG_BN), k_tiles = (K + WG_BK - 1) / WG_BK;
    const int warpgroup = threadIdx.x >> 7;
    if (warpgroup == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (threadIdx.x != 0) return;
        int step = 0;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            int m0, n0;
            tile_origin(tile, M, N, m0, n0);
            for (int t = 0; t < k_tiles; ++t, ++step) {
                const int s = step % WG_STAGES;
                barrier_wait(empty(s), ((step / WG_STAGES) & 1) ^ 1);
                barrier_expect(full(s), WG_STAGE_BYTES);
                tma_load(stage_a(s), x_map, full(s), t * WG_BK, m0);
                tma_load(stage_b(s), w_map, full(s), t * WG_BK, n0);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int lane = threadIdx.x & 31;
    const unsigned rows_offset = (warpgroup - 1) * 64 * 128;
    int step = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        int m0, n0;
        tile_origin(tile, M, N, m0, n0);
        float d[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) d[i] = 0.0f;
        for (int t = 0; t < k_tiles; ++t, ++step) {
            const int s = step % WG_STAGES;
            barrier_wait(full(s), (step / WG_STAGES) & 1);
            multiply_k_tile(d, stage_a(s) + rows_offset, stage_b(s));
            if (t > 0 && lane == 0) barrier_arrive(empty((step - 1) % WG_STAGES));
        }
        wgmma_wait<0>();
        fence_operands(d);
        if (lane == 0 && k_tiles > 0) barrier_arrive(empty((step - 1) % WG_STAGES));
        store_tile(d, bias, out, ldo, m0 + (warpgroup - 1) * 64, n0, M, N);
    }
}

#endif

// A persistent grid of at most one block an SM, 384 threads, gemm_wgmma_shared_bytes of shared memory; x_map reads
// x [M, K] in boxes of 64 columns x 128 rows, w_map w [N, K] in boxes of 64 x 256, both with the 128-byte swizzle.
extern "C" __global__ void __launch_bounds__(384, 1)
    gemm_wgmma_bf16(const __grid_constant__ TensorMap x_map, const __grid_constant__ TensorMap w_map,
                    const bf16_t* __restrict__ bias, bf16_t* __restrict__ out, long long ldo, int M, int N, int K) {
    await_inputs();
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    wgmma_product(x_map, w_map, bias, out, ldo, M, N, K);
#else
    __trap();
#endif
}
