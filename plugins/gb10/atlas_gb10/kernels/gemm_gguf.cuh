// GGUF Q8_0 weights (W8A16) for gemm_core.cuh's products: `Q8_0Weight`, its bank matrices and its `accumulate`,
// found for W = Q8_0Weight where gemm_tile / expert_product are instantiated (gemm.cu, moe.cu).
//
// llama.cpp's blocks (QuantizedWeight format gguf_q8_0, atlas_core.weights.gguf_quantized: per row, K / 32 blocks
// of 34 bytes, an f16 scale d then 32 int8 codes; W[i, j] = d * q) are laid out apart at upload
// (atlas_gb10.quantized_weights.q8_0_device_rows), the same bytes: per row the K codes, in each full 64-byte group
// lane by lane as FP8 rows are (gemm_fp8.cuh: one 16-byte load gives a lane its codes of two chunks), then the
// K / 32 scales, the row padded to 16 bytes. A 32-wide K chunk is one block: its codes enter the tensor cores as
// exact bf16 values, the chunk's products are summed apart and added times each row's block scale, in chunk
// order (the fixed order of every weight: batch invariance holds).
#pragma once
#include "gemm_fp8.cuh"

struct Q8_0Weight {
    const unsigned char* data;
};

template <>
struct ChunksPerLoad<Q8_0Weight> {
    static constexpr int value = 2;
};

// A row's bytes on the device: K codes and K / 32 f16 scales, padded to 16.
__device__ __forceinline__ long long q8_0_row_bytes(int K) { return ((long long)K + K / 16 + 15) / 16 * 16; }

__device__ __forceinline__ Q8_0Weight bank_matrix(const Q8_0Weight& w, int e, int N, int K) {
    return Q8_0Weight{w.data + (long long)e * N * q8_0_row_bytes(K)};
}

// An f16's value, exactly: its exponent and mantissa placed in a float's (bias 127 instead of 15) times 2^112;
// f16 subnormals land on float subnormals, which the product normalises.
__device__ __forceinline__ float f16_bits_to_float(unsigned h) {
    return __uint_as_float(((h & 0x8000u) << 16) | ((h & 0x7fffu) << 13)) * 0x1p112f;
}

// The four int8 codes of `word` as two bf16 pairs, exactly: `lo` codes 0 and 1, `hi` codes 2 and 3 (the first
// of each in the low half). A code c (offset to c + 128 by the xor) goes under a float's exponent byte by one
// prmt: 2^23 + 128 + c, less 2^23 + 128, is c itself, and its upper 16 bits its bf16 (8 significant bits at
// most); a last prmt packs two of them.
__device__ __forceinline__ void i8x4_to_bf16x2(unsigned word, unsigned& lo, unsigned& hi) {
    const unsigned offset = word ^ 0x80808080u, magic = 0x4b000000u;
    const float c0 = __uint_as_float(__byte_perm(offset, magic, 0x7440)) - 8388736.0f;
    const float c1 = __uint_as_float(__byte_perm(offset, magic, 0x7441)) - 8388736.0f;
    const float c2 = __uint_as_float(__byte_perm(offset, magic, 0x7442)) - 8388736.0f;
    const float c3 = __uint_as_float(__byte_perm(offset, magic, 0x7443)) - 8388736.0f;
    lo = __byte_perm(__float_as_uint(c0), __float_as_uint(c1), 0x7632);
    hi = __byte_perm(__float_as_uint(c2), __float_as_uint(c3), 0x7632);
}

// Row `row`'s scale of block `block` (0 past the matrix).
__device__ __forceinline__ float q8_0_scale(const unsigned char* __restrict__ w, int row, int rows, int block, int K) {
    if (row >= rows) return 0.0f;
    const unsigned short* p = reinterpret_cast<const unsigned short*>(w + row * q8_0_row_bytes(K) + K);
    return f16_bits_to_float(__ldg(p + block));
}

// mma_chunks over a Q8_0 weight: acc += scale(column, chunk) * (products of chunk c), chunk by chunk in order.
template <int MT, int NT, int U, int VEC>
__device__ __forceinline__ void accumulate(const bf16_t* __restrict__ x, long long ldx, const int* __restrict__ x_rows,
                                           const Q8_0Weight& w, int m0, int M, int n0, int N, int K, int c_begin,
                                           int c_end, float (&acc)[MT][NT][4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const unsigned char* w_rows[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) w_rows[j] = w.data + min(n0 + j * 8 + g, N - 1) * q8_0_row_bytes(K) + 16 * q;
    chunk_batches<MT, NT, U, 2, VEC, uint2>(
        x, ldx, x_rows, m0, M, K, c_begin, c_end, n0 + NT * 8 <= N,
        [&](int c, int j, uint2(&raw)[2], auto checked) {
            if constexpr (decltype(checked)::value) {
                fp8_pair_in_rows<VEC>(w.data, q8_0_row_bytes(K), n0 + j * 8 + g, N, c, K, raw);
            } else {
                pair_at(w_rows[j] + c * 32, raw);
            }
        },
        [&](int c, const uint2 (&raw)[NT], const Frag8 (&a)[MT][2]) {
            Frag8 b[NT];
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                i8x4_to_bf16x2(raw[j].x, b[j].w[0], b[j].w[1]);
                i8x4_to_bf16x2(raw[j].y, b[j].w[2], b[j].w[3]);
            }
            float part[MT][NT][4];
            zero_frags<MT, NT>(part);
            mma_chunk<MT, NT, VEC>(part, a, b);
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int p = 0; p < FragMap<VEC, NT>::COLUMNS; ++p)
                    add_column<MT, NT, VEC>(acc, part, j, p,
                                            q8_0_scale(w.data, n0 + FragMap<VEC, NT>::column(j, p), N, c, K));
        });
}
