// NVFP4 weights (W4A16) for gemm_core.cuh's products: `Nvfp4Weight`, its bank matrices and its `accumulate`,
// found for W = Nvfp4Weight where gemm_tile / expert_product are instantiated (gemm.cu, moe.cu).
//
// The weight keeps QuantizedWeight's NVFP4 rows (atlas_core.weights.nvfp4: per row, K / 2 bytes of packed E2M1
// elements, K / 16 E4M3 group scales, then the row's global factor as a little-endian float64; K % 16 == 0), with
// three changes made at upload (atlas_gb10.quantized_weights.nvfp4_device_rows):
// - within each 4-byte word of 8 elements, nibble t holds element 2t and nibble t + 4 element 2t + 1 (t = 0 ..
//   3), so that one shift and two masks put a pair's codes in the two halves of a bf16 pair;
// - in each full group of four 32-element chunks (64 bytes of codes, 8 scales), lane q's words of the four
//   chunks are consecutive (16 bytes from 16q) and so are its four scales (4 bytes from 4 (q / 2)), so a lane
//   loads its share of four chunks at once; a row's last chunks past the last full group keep their order;
// - rows are padded to a multiple of 16 bytes (`nvfp4_row_bytes`). Each element enters the tensor cores as e2m1 x its
// group's E4M3 scale x 2^-8, a bf16 value exactly (2 and 4 significant bits), and a column's sum is multiplied by
// its row's factor (rounded to float32) x 2^8 at the end: the product of W[i, j] = e2m1 * e4m3 * factor up to
// the factor's float32 rounding, in the same fixed chunk order as every other weight, so batch invariance holds.
#pragma once
#include "gemm_core.cuh"

struct Nvfp4Weight {
    const unsigned char* data;
};

// A row's bytes on the device: codes, scales and factor, padded to 16.
__device__ __forceinline__ long long nvfp4_row_bytes(int K) { return (K / 2 + K / 16 + 8 + 15) / 16 * 16; }

template <>
struct ChunksPerLoad<Nvfp4Weight> {
    static constexpr int value = 4;
};

__device__ __forceinline__ Nvfp4Weight bank_matrix(const Nvfp4Weight& w, int e, int N, int K) {
    return Nvfp4Weight{w.data + (long long)e * N * nvfp4_row_bytes(K)};
}

// The bf16 pair of elements 2t and 2t + 1 of an interleaved word times the group scale s2 (a bf16 pair of
// e4m3 x 2^118): the codes' sign bits land on the halves' signs and their 3 magnitude bits on a bf16's lowest
// two exponent bits and first mantissa bit, which reads e2m1 x 2^-126 (codes 0 and 1 on bf16 subnormals); the
// bf16 product by s2 is e2m1 x e4m3 x 2^-8, exact.
template <int T>
__device__ __forceinline__ unsigned e2m1_pair_scaled(unsigned word, unsigned s2) {
    const unsigned q = word << (12 - 4 * T);
    return bf16x2_mul((q & 0x80008000u) | ((q & 0x70007000u) >> 6), s2);
}

// An E4M3 group scale byte as a bf16 pair of its value x 2^118 (below 2^127 for every finite scale).
__device__ __forceinline__ unsigned e4m3_scale_pair(unsigned b) {
    const float s = __uint_as_float(((b & 0x80u) << 24) | ((b & 0x7fu) << 20)) * 0x1p119f * 0x1p119f;
    const unsigned bits = __float_as_uint(s) >> 16;
    return bits | (bits << 16);
}

// Elements k .. k + 7 of a row: their interleaved word and their group's scale pair (e4m3_scale_pair).
struct Nvfp4Chunk {
    unsigned packed, scale;
};

// Row `row`'s elements k .. k + 7 (k % 8 == 0; zeros outside the matrix), outside full groups. VEC: one 4-byte
// load.
template <int VEC>
__device__ __forceinline__ Nvfp4Chunk load_nvfp4x8(const unsigned char* __restrict__ w, int row, int rows, int k, int K) {
    Nvfp4Chunk chunk{0u, 0u};
    if (row < 0 || row >= rows || k >= K) return chunk;
    const unsigned char* p = w + row * nvfp4_row_bytes(K);
    if (VEC) {
        chunk.packed = __ldg(reinterpret_cast<const unsigned*>(p + k / 2));
    } else {
#pragma unroll
        for (int b = 0; b < 4; ++b) chunk.packed |= (unsigned)p[k / 2 + b] << (8 * b);
    }
    chunk.scale = e4m3_scale_pair(p[K / 2 + k / 16]);
    return chunk;
}

// This lane's elements of chunks c .. c + 3 (a full group, c % 4 == 0) of the row at p, rows 16-byte aligned: one
// 16-byte load of codes and one 4-byte load of scales, without tests.
__device__ __forceinline__ void nvfp4_quad_at(const unsigned char* p, int c, int K, Nvfp4Chunk (&out)[4]) {
    const int q = threadIdx.x & 3;
    const Frag8 words = frag_at(p + c * 16 + 16 * q);
    const unsigned scales = __ldg(reinterpret_cast<const unsigned*>(p + K / 2 + c * 2 + 4 * (q >> 1)));
#pragma unroll
    for (int h = 0; h < 4; ++h) out[h] = Nvfp4Chunk{words.w[h], e4m3_scale_pair((scales >> (8 * h)) & 0xffu)};
}

// This lane's elements of chunks c .. c + 3 of row `row` (c % 4 == 0; c = -1: zeros): from a full group one
// 16-byte load of codes (VEC; rows 16-byte aligned) and one 4-byte load of scales; otherwise chunk by chunk.
template <int VEC>
__device__ __forceinline__ void load_nvfp4_quad(const unsigned char* __restrict__ w, int row, int rows, int c, int K,
                                                Nvfp4Chunk (&out)[4]) {
    if (c < 0 || (c + 4) * 32 > K || row < 0 || row >= rows) {
#pragma unroll
        for (int h = 0; h < 4; ++h) out[h] = load_nvfp4x8<VEC>(w, row, rows, lane_k(c < 0 ? c : c + h, K), K);
        return;
    }
    const unsigned char* p = w + row * nvfp4_row_bytes(K);
    if (VEC) {
        nvfp4_quad_at(p, c, K, out);
        return;
    }
    const int q = threadIdx.x & 3;
    unsigned words[4], scales = 0u;
#pragma unroll
    for (int h = 0; h < 4; ++h) {
        words[h] = 0u;
#pragma unroll
        for (int b = 0; b < 4; ++b) words[h] |= (unsigned)p[c * 16 + 16 * q + 4 * h + b] << (8 * b);
        scales |= (unsigned)p[K / 2 + c * 2 + 4 * (q >> 1) + h] << (8 * h);
    }
#pragma unroll
    for (int h = 0; h < 4; ++h) out[h] = Nvfp4Chunk{words[h], e4m3_scale_pair((scales >> (8 * h)) & 0xffu)};
}

// Row `row`'s global factor in float32 times 2^8 (0 past the matrix).
__device__ __forceinline__ float nvfp4_factor(const unsigned char* __restrict__ w, int row, int rows, int K) {
    if (row >= rows) return 0.0f;
    const unsigned char* p = w + row * nvfp4_row_bytes(K) + K / 2 + K / 16;
    unsigned long long bits = 0ull;
#pragma unroll
    for (int b = 0; b < 8; ++b) bits |= (unsigned long long)p[b] << (8 * b);
    return (float)__longlong_as_double((long long)bits) * 256.0f;
}

// mma_chunks over an NVFP4 weight: acc += factor(column) * (products of the chunks c_begin .. c_end - 1).
template <int MT, int NT, int U, int VEC>
__device__ __forceinline__ void accumulate(const bf16_t* __restrict__ x, long long ldx, const int* __restrict__ x_rows,
                                           const Nvfp4Weight& w, int m0, int M, int n0, int N, int K, int c_begin,
                                           int c_end, float (&acc)[MT][NT][4]) {
    const int g = (threadIdx.x & 31) >> 2;
    float part[MT][NT][4];
    zero_frags<MT, NT>(part);
    const unsigned char* w_rows[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) w_rows[j] = w.data + min(n0 + j * 8 + g, N - 1) * nvfp4_row_bytes(K);
    chunk_batches<MT, NT, U, 4, VEC, Nvfp4Chunk>(
        x, ldx, x_rows, m0, M, K, c_begin, c_end, n0 + NT * 8 <= N,
        [&](int c, int j, Nvfp4Chunk(&raw)[4], auto checked) {
            if constexpr (decltype(checked)::value)
                load_nvfp4_quad<VEC>(w.data, n0 + j * 8 + g, N, c, K, raw);
            else
                nvfp4_quad_at(w_rows[j], c, K, raw);
        },
        [&](int, const Nvfp4Chunk (&chunk)[NT], const Frag8 (&a)[MT][2]) {
            Frag8 b[NT];
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const unsigned word = chunk[j].packed, s2 = chunk[j].scale;
                b[j] = Frag8{{e2m1_pair_scaled<0>(word, s2), e2m1_pair_scaled<1>(word, s2),
                              e2m1_pair_scaled<2>(word, s2), e2m1_pair_scaled<3>(word, s2)}};
            }
            mma_chunk<MT, NT, VEC>(part, a, b);
        });
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int p = 0; p < FragMap<VEC, NT>::COLUMNS; ++p)
            add_column<MT, NT, VEC>(acc, part, j, p,
                                    nvfp4_factor(w.data, n0 + FragMap<VEC, NT>::column(j, p), N, K));
}
