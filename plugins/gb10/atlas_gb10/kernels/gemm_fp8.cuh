// FP8 E4M3 weights with block scales (W8A16) for gemm_core.cuh's products: `Fp8Weight`, its bank matrices and its
// `accumulate`, found for W = Fp8Weight where gemm_tile / expert_product are instantiated (gemm.cu, moe.cu).
//
// An FP8 element enters the tensor cores as its exact bf16 value (every E4M3 value is one), each scale block's
// products are summed apart, and the block's sum is multiplied by its scale into the accumulator, in chunk order
// (the same fixed order whatever M, so batch invariance holds). Blocks are 64k columns wide, or span all of K
// (per-channel and per-tensor scales).
//
// Rows are stored as uploaded (atlas_gb10.quantized_weights.pair_fp8_chunks): in each full 64-byte group of two
// chunks, lane q's 8 bytes of the first chunk are followed by its 8 bytes of the second, so one 16-byte load
// brings a lane both (`fp8_pair_in_rows`); a row's last chunk of K % 64 elements keeps its order.
#pragma once
#include "gemm_core.cuh"

// A weight [N, K] (or bank [E, N, K]) in FP8 E4M3 bytes with one float32 scale per (bn x bk) block:
// scales [ceil(N / bn), ceil(K / bk)] per matrix (QuantizedWeight in atlas_core.weights.quantized).
struct Fp8Weight {
    const unsigned char* data;
    const float* scales;
    int bn, bk;
};

template <>
struct ChunksPerLoad<Fp8Weight> {
    static constexpr int value = 2;
};

__device__ __forceinline__ Fp8Weight bank_matrix(const Fp8Weight& w, int e, int N, int K) {
    const long long scale_rows = (N + w.bn - 1) / w.bn, scale_cols = (K + w.bk - 1) / w.bk;
    return Fp8Weight{w.data + (long long)e * N * K, w.scales + e * scale_rows * scale_cols, w.bn, w.bk};
}

// Bytes k .. k+7 of the row at p (zeros from K on). VEC: one 8-byte load (K % 8 == 0).
template <int VEC>
__device__ __forceinline__ uint2 load_bytes8(const unsigned char* __restrict__ p, int k, int K) {
    uint2 v = make_uint2(0u, 0u);
    if (k >= K) return v;
    if (VEC) return __ldg(reinterpret_cast<const uint2*>(p + k));
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        if (k + e < K) v.x |= (unsigned)p[k + e] << (8 * e);
        if (k + 4 + e < K) v.y |= (unsigned)p[k + 4 + e] << (8 * e);
    }
    return v;
}

// The 16 bytes at p (16-byte aligned): this lane's 8 bytes of a chunk and its 8 of the next.
__device__ __forceinline__ void pair_at(const unsigned char* p, uint2 (&out)[2]) {
    const Frag8 f = frag_at(p);
    out[0] = make_uint2(f.w[0], f.w[1]);
    out[1] = make_uint2(f.w[2], f.w[3]);
}

// This lane's bytes of chunks c, c + 1 of row `row` of byte rows `stride` apart holding K elements from their
// start (c even; c = -1 or a row past the matrix: zeros). A full 64-byte group is paired (16 bytes from 16q);
// VEC: one 16-byte load (rows 16-byte aligned). A row's last chunk alone keeps its order.
template <int VEC>
__device__ __forceinline__ void fp8_pair_in_rows(const unsigned char* __restrict__ w, long long stride, int row,
                                                 int rows, int c, int K, uint2 (&out)[2]) {
    out[0] = out[1] = make_uint2(0u, 0u);
    if (c < 0 || row < 0 || row >= rows) return;
    const unsigned char* p = w + row * stride;
    if ((c + 2) * 32 > K) {
        out[0] = load_bytes8<VEC>(p, lane_k(c, K), K);
        out[1] = load_bytes8<VEC>(p, lane_k(c + 1, K), K);
        return;
    }
    const int q = threadIdx.x & 3;
    if (VEC) {
        pair_at(p + c * 32 + 16 * q, out);
    } else {
        out[0] = load_bytes8<0>(p + c * 32 + 16 * q, 0, 8);
        out[1] = load_bytes8<0>(p + c * 32 + 16 * q + 8, 0, 8);
    }
}

// acc += scale(block) * (products of the block's chunks c_begin .. c_end - 1), block by block in chunk order.
// Needs bk % 64 == 0 or bk >= K (the host keeps other layouts in bf16).
template <int MT, int NT, int U, int VEC>
__device__ __forceinline__ void accumulate(const bf16_t* __restrict__ x, long long ldx, const int* __restrict__ x_rows,
                                           const Fp8Weight& w, int m0, int M, int n0, int N, int K, int c_begin,
                                           int c_end, float (&acc)[MT][NT][4]) {
    using Frags = FragMap<VEC, NT>;
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int scale_cols = (K + w.bk - 1) / w.bk;
    const int chunks_per_block = w.bk >= K ? c_end + 1 : w.bk / 32;
    const float* scale_rows[NT][Frags::COLUMNS];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int p = 0; p < Frags::COLUMNS; ++p) {
            const int col = n0 + Frags::column(j, p);
            scale_rows[j][p] = col < N ? w.scales + (long long)(col / w.bn) * scale_cols : nullptr;
        }
    float part[MT][NT][4];
    zero_frags<MT, NT>(part);
    int block = c_begin / chunks_per_block;
    int next_block = (block + 1) * chunks_per_block;
    // The current block's scales, loaded as the block starts so that its flush does not wait for them.
    float scale[NT][Frags::COLUMNS];
    auto load_scales = [&](int b) {
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int p = 0; p < Frags::COLUMNS; ++p)
                scale[j][p] = scale_rows[j][p] && b < scale_cols ? scale_rows[j][p][b] : 0.0f;
    };
    load_scales(block);
    auto flush = [&]() {
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int p = 0; p < Frags::COLUMNS; ++p) add_column<MT, NT, VEC>(acc, part, j, p, scale[j][p]);
        zero_frags<MT, NT>(part);
    };
    // Chunk c's products from its weight bytes raw[j] (n-tile j) and x fragments a.
    auto multiply = [&](int c, const uint2 (&raw)[NT], const Frag8 (&a)[MT][2]) {
        if (c >= next_block) {
            flush();
            load_scales(++block);
            next_block += chunks_per_block;
        }
        Frag8 b[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const uint4 v = e4m3x8_to_bf16x8(raw[j]);
            b[j] = Frag8{{v.x, v.y, v.z, v.w}};
        }
        mma_chunk<MT, NT, VEC>(part, a, b);
    };
    const unsigned char* w_rows[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) w_rows[j] = w.data + (long long)min(n0 + j * 8 + g, N - 1) * K + 16 * q;
    chunk_batches<MT, NT, U, 2, VEC, uint2>(
        x, ldx, x_rows, m0, M, K, c_begin, c_end, n0 + NT * 8 <= N,
        [&](int c, int j, uint2(&raw)[2], auto checked) {
            if constexpr (decltype(checked)::value) {
                fp8_pair_in_rows<VEC>(w.data, K, n0 + j * 8 + g, N, c, K, raw);
            } else {
                pair_at(w_rows[j] + c * 32, raw);
            }
        },
        multiply);
    if (c_begin < c_end) flush();
}
