// The tiled bf16 product of prefill-sized GEMMs (gemm_tiled.cu) and MoE expert groups (moe.cu): output tiles of
// 32 * WM rows by TG_BN columns, both operands staged through shared memory in 32-wide k-slices by cp.async
// (TG_STAGES slices in flight), fragments read with ldmatrix, mma.sync.m16n8k16 (bf16 in, fp32 accumulation;
// sm_80 and later, Hopper and GB10 alike). 8 warps as 2 x 4, each computing 16 WM x 32 of the tile. Needs K % 8
// == 0, 16-byte aligned rows and row strides that are multiples of 8 elements; rows past M or N and k past K
// are zero-filled.
//
// An output element is one thread's sum over the k-slices in order, whatever the rows around it, so a row's
// result does not depend on the other rows; it differs from gemm_core.cuh's (whose K order is split across
// warps), which is why the batch-invariant mode keeps gemm_core.cuh's kernels for every size.
#pragma once
#include "gemm_core.cuh"

#define TG_BN 128
#define TG_BK 32
#define TG_STAGES 3
#define TG_LD (TG_BK + 8)  // padded shared rows (80 bytes): conflict-free ldmatrix
#define TG_THREADS 256

__device__ __forceinline__ void cp_async16_zfill(void* dst, const void* src, bool valid) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void tg_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

__device__ __forceinline__ void tg_wait_all_but_one() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

__device__ __forceinline__ void tg_ldmatrix_x4(unsigned* r, const bf16_t* p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// One k-slice of the ROWS rows from `first` (below `rows`) of a row-major [., K] operand into `dst`
// ([ROWS][TG_LD]); row r reads source row `src_rows ? src_rows[r] : r`.
template <int ROWS>
__device__ __forceinline__ void tg_load_slice(bf16_t* dst, const bf16_t* __restrict__ src, long long ld,
                                              const int* __restrict__ src_rows, int first, int rows, int k0, int K,
                                              int tid) {
#pragma unroll
    for (int i = 0; i < (ROWS * TG_BK / 8) / TG_THREADS; ++i) {
        const int c = tid + i * TG_THREADS;
        const int r = c / (TG_BK / 8), kc = (c % (TG_BK / 8)) * 8;
        const bool valid = first + r < rows && k0 + kc < K;
        const long long row = valid ? (src_rows ? src_rows[first + r] : first + r) : 0;
        const bf16_t* from = valid ? src + row * ld + k0 + kc : src;
        cp_async16_zfill(dst + r * TG_LD + kc, from, valid);
    }
}

// out[r, n0 ..] = x[x_rows ? x_rows[r] : r, :] @ w[n0 .., :]^T (+ bias) for the rows r in [m0, min(m0 + BM, M)) of
// one block, BM = 32 * WM rows (WM m16 tiles per warp, 2 warps along the rows) by TG_BN columns from n0; with
// relu2, max(that rounded to bf16, 0)^2. Dynamic shared memory: `tiled_shared_bytes(WM)`.
template <int WM>
__device__ __forceinline__ void tiled_product(const bf16_t* __restrict__ x, long long ldx, const int* __restrict__ x_rows,
                                              const bf16_t* __restrict__ w, const bf16_t* __restrict__ bias,
                                              bf16_t* __restrict__ out, long long ldo, int m0, int M, int n0, int N,
                                              int K, int relu2) {
    constexpr int BM = 32 * WM;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16_t* As = reinterpret_cast<bf16_t*>(smem);  // [TG_STAGES][BM][TG_LD]
    bf16_t* Bs = As + TG_STAGES * BM * TG_LD;      // [TG_STAGES][TG_BN][TG_LD]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 2, wn = warp & 3;  // this warp's 16 WM x 32 of the tile
    const int bm = m0, bn = n0;
    const int slices = (K + TG_BK - 1) / TG_BK;

#pragma unroll
    for (int s = 0; s < TG_STAGES - 1; ++s) {
        if (s < slices) {
            tg_load_slice<BM>(As + s * BM * TG_LD, x, ldx, x_rows, bm, M, s * TG_BK, K, tid);
            tg_load_slice<TG_BN>(Bs + s * TG_BN * TG_LD, w, K, nullptr, bn, N, s * TG_BK, K, tid);
        }
        tg_commit();
    }

    float acc[WM][4][4];
#pragma unroll
    for (int i = 0; i < WM; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

    for (int kt = 0; kt < slices; ++kt) {
        tg_wait_all_but_one();
        __syncthreads();  // slice kt is in; every warp is done with the stage refilled below
        const int next = kt + TG_STAGES - 1;
        if (next < slices) {
            const int stage = next % TG_STAGES;
            tg_load_slice<BM>(As + stage * BM * TG_LD, x, ldx, x_rows, bm, M, next * TG_BK, K, tid);
            tg_load_slice<TG_BN>(Bs + stage * TG_BN * TG_LD, w, K, nullptr, bn, N, next * TG_BK, K, tid);
        }
        tg_commit();  // possibly empty: the group count stays one per slice
        const bf16_t* A = As + (kt % TG_STAGES) * BM * TG_LD;
        const bf16_t* B = Bs + (kt % TG_STAGES) * TG_BN * TG_LD;
#pragma unroll
        for (int kk = 0; kk < TG_BK / 16; ++kk) {
            unsigned a[WM][4], b[2][4];
#pragma unroll
            for (int i = 0; i < WM; ++i)
                tg_ldmatrix_x4(a[i], A + (wm * 16 * WM + i * 16 + (lane & 15)) * TG_LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int j = 0; j < 2; ++j)
                tg_ldmatrix_x4(b[j], B + (wn * 32 + j * 16 + (lane & 7) + ((lane >> 4) << 3)) * TG_LD + kk * 16 +
                                         ((lane >> 3) & 1) * 8);
#pragma unroll
            for (int i = 0; i < WM; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    mma_16816(acc[i][j], a[i][0], a[i][1], a[i][2], a[i][3], b[j >> 1][(j & 1) * 2],
                              b[j >> 1][(j & 1) * 2 + 1]);
        }
    }

    const int g = lane >> 2, qd = lane & 3;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int col = bn + wn * 32 + j * 8 + 2 * qd;
        const float b0 = bias && col < N ? bf16_to_float(bias[col]) : 0.0f;
        const float b1 = bias && col + 1 < N ? bf16_to_float(bias[col + 1]) : 0.0f;
#pragma unroll
        for (int i = 0; i < WM; ++i) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int row = bm + wm * 16 * WM + i * 16 + g + 8 * half;
                if (row >= M) continue;
                bf16_t* dst = out + (long long)row * ldo + col;
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    if (col + e >= N) continue;
                    float v = acc[i][j][2 * half + e] + (e ? b1 : b0);
                    if (relu2) {
                        v = fmaxf(bf16_to_float(float_to_bf16(v)), 0.0f);
                        v = v * v;
                    }
                    dst[e] = float_to_bf16(v);
                }
            }
        }
    }
}
