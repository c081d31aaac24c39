// FP8 E4M3 weights with block scales (W8A16) for gemm_core.cuh's products: `Fp8Weight`, its bank matrices and its
// `accumulate`, found for W = Fp8Weight where gemm_tile / expert_product are instantiated (gemm.cu, moe.cu).
//
// An FP8 element enters the tensor cores as its exact bf16 value (every E4M3 value is one), each scale block's
// products are summed apart, and the block's sum is multiplied by its scale into the accumulator, in chunk order
// (the same fixed order whatever M, so batch invariance holds). Blocks are 32k columns wide, or span all of K
// (per-channel and per-tensor scales).
#pragma once
#include "gemm_core.cuh"

// A weight [N, K] (or bank [E, N, K]) in FP8 E4M3 bytes with one float32 scale per (bn x bk) block:
// scales [ceil(N / bn), ceil(K / bk)] per matrix (QuantizedWeight in atlas_core.weights.quantized).
struct Fp8Weight {
    const unsigned char* data;
    const float* scales;
    int bn, bk;
};

__device__ __forceinline__ Fp8Weight bank_matrix(const Fp8Weight& w, int e, int N, int K) {
    const long long scale_rows = (N + w.bn - 1) / w.bn, scale_cols = (K + w.bk - 1) / w.bk;
    return Fp8Weight{w.data + (long long)e * N * K, w.scales + e * scale_rows * scale_cols, w.bn, w.bk};
}

// Bytes k .. k+7 of row `row` of an FP8 matrix [rows, K] (zeros outside). VEC: one 8-byte load (K % 8 == 0).
template <int VEC>
__device__ __forceinline__ uint2 load_fp8x8(const unsigned char* __restrict__ w, int row, int rows, int k, int K) {
    uint2 v = make_uint2(0u, 0u);
    if (row >= 0 && row < rows && k < K) {
        const unsigned char* p = w + (long long)row * K + k;
        if (VEC) {
            v = __ldg(reinterpret_cast<const uint2*>(p));
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (k + e < K) v.x |= (unsigned)p[e] << (8 * e);
                if (k + 4 + e < K) v.y |= (unsigned)p[4 + e] << (8 * e);
            }
        }
    }
    return v;
}

// acc += scale(block) * (products of the block's chunks c_begin .. c_end - 1), block by block in chunk order.
// Needs bk % 32 == 0 or bk >= K (the host keeps other layouts in bf16).
template <int MT, int NT, int U, int VEC>
__device__ __forceinline__ void accumulate(const bf16_t* __restrict__ x, long long ldx, const int* __restrict__ x_rows,
                                           const Fp8Weight& w, int m0, int M, int n0, int N, int K, int c_begin,
                                           int c_end, float (&acc)[MT][NT][4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int scale_cols = (K + w.bk - 1) / w.bk;
    const int chunks_per_block = w.bk >= K ? c_end + 1 : w.bk / 32;
    const float* scale_rows[NT][2];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            const int col = n0 + j * 8 + 2 * q + p;
            scale_rows[j][p] = col < N ? w.scales + (long long)(col / w.bn) * scale_cols : nullptr;
        }
    float part[MT][NT][4];
    zero_frags<MT, NT>(part);
    int block = c_begin / chunks_per_block;
    int next_block = (block + 1) * chunks_per_block;
    auto flush = [&]() {
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float* row = scale_rows[j][e & 1];
                    acc[i][j][e] = __fmaf_rn(part[i][j][e], row ? row[block] : 0.0f, acc[i][j][e]);
                    part[i][j][e] = 0.0f;
                }
    };
    // Chunk c's products from its weight bytes raw[j] (n-tile j) and x fragments a.
    auto multiply = [&](int c, const uint2 (&raw)[NT], const Frag8 (&a)[MT][2]) {
        if (c >= next_block) {
            flush();
            ++block;
            next_block += chunks_per_block;
        }
        Frag8 b[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const uint4 v = e4m3x8_to_bf16x8(raw[j]);
            b[j] = Frag8{{v.x, v.y, v.z, v.w}};
        }
        mma_chunk<MT, NT>(part, a, b);
    };
    chunk_batches<MT, NT, U, VEC, uint2>(
        x, ldx, x_rows, m0, M, K, c_begin, c_end,
        [&](int k, int j) { return load_fp8x8<VEC>(w.data, n0 + j * 8 + g, N, k, K); }, multiply);
    if (c_begin < c_end) flush();
}
