// GGUF block formats besides Q8_0 for the dense products (gemm.cu built with GGUF_TYPE, one format a module):
// Q4_0, Q4_1, Q5_0, Q5_1 (blocks of 32 elements) and Q4_K, Q5_K, Q6_K (super-blocks of 256: 8 sub-blocks of
// 32). `GgufBlocks<T>` (T the GGML type id) keeps llama.cpp's bytes (QuantizedWeight formats gguf_q4_0 ...,
// atlas_core.weights.gguf_quantized): the K-quants' rows of K / BLOCK blocks of BYTES bytes as stored, the
// 32-element formats' rows laid out apart at upload (codes, high bits, coefficients: `GgufBlocks::APART`).
//
// A 32-wide K chunk is one block or sub-block. Its codes n (4, 5 or 6 bits) enter the tensor cores as exact bf16
// values n - bias (each pair through one prmt, masks and one bf16 fma of 128 + n: `codes_to_bf16x2`), and each
// column adds, in chunk order (batch invariance holds):
//   s * (chunk's products) + o * (chunk's sum of x)
// with W[i, j] = s * (n - bias) + o as GGML defines it: Q4_0 d (n - 8); Q4_1 d n + m; Q5_0 d (n - 16); Q5_1
// d n + m; Q4_K and Q5_K d sc n - dmin mn (6-bit sc, mn of the sub-block); Q6_K d sc (n - 32) with an int8 sc
// per 16 elements, so a Q6_K chunk is multiplied twice, each time with the other half's codes zeroed (lanes
// 0-1 hold elements 0-15, lanes 2-3 elements 16-31). x's chunk sums come from one more mma against ones.
#pragma once
#include "gemm_gguf.cuh"

#define GGUF_Q4_0 2
#define GGUF_Q4_1 3
#define GGUF_Q5_0 6
#define GGUF_Q5_1 7
#define GGUF_Q4_K 12
#define GGUF_Q5_K 13
#define GGUF_Q6_K 14

template <int T>
struct GgufBlocks {
    const unsigned char* data;
    static constexpr bool K_QUANT = T >= GGUF_Q4_K;
    static constexpr int BLOCK = K_QUANT ? 256 : 32;
    static constexpr int BYTES = T == GGUF_Q4_0   ? 18
                                 : T == GGUF_Q4_1 ? 20
                                 : T == GGUF_Q5_0 ? 22
                                 : T == GGUF_Q5_1 ? 24
                                 : T == GGUF_Q4_K ? 144
                                 : T == GGUF_Q5_K ? 176
                                                  : 210;
    static constexpr bool OFFSET = T == GGUF_Q4_1 || T == GGUF_Q5_1 || T == GGUF_Q4_K || T == GGUF_Q5_K;
    // bf16 pair of -(128 + bias): codes_to_bf16x2's addend.
    static constexpr unsigned NEG_BIAS = T == GGUF_Q4_0   ? 0xc308c308u
                                         : T == GGUF_Q5_0 ? 0xc310c310u
                                         : T == GGUF_Q6_K ? 0xc320c320u
                                                          : 0xc300c300u;
    // Q4_0, Q4_1, Q5_0, Q5_1 rows are laid out apart at upload (atlas_gb10.quantized_weights.gguf_device_rows): the
    // K / 2 code bytes (a block's 16 at 16 b), then Q5's K / 8 high-bit bytes (4 a block), then the coefficients
    // (d, or d and m: 2 or 4 bytes a block), the row padded to 16 bytes; the K-quants keep llama.cpp's blocks.
    static constexpr bool APART = !K_QUANT;
    static constexpr bool HIGH_BITS = T == GGUF_Q5_0 || T == GGUF_Q5_1;
    __device__ __forceinline__ static long long row_bytes(int K) {
        return APART ? ((long long)(K / BLOCK) * BYTES + 15) / 16 * 16 : (long long)(K / BLOCK) * BYTES;
    }
    __device__ __forceinline__ static int high_bits_at(int K) { return K / 2; }
    __device__ __forceinline__ static int coefficients_at(int K) { return K / 2 + (HIGH_BITS ? K / 8 : 0); }
};

// Consecutive chunks that one lane's loads serve: Q4_K and Q5_K sub-blocks 2i and 2i + 1 hold their codes in the low
// and high nibbles of the same bytes (Q5_K's high bits: one byte per 8 elements of all 8 sub-blocks); Q6_K's
// quarters 0 and 2 of a half share their code bytes, quarters 1 and 3 theirs, and all four their high-bit bytes.
template <int T>
struct ChunksPerLoad<GgufBlocks<T>> {
    static constexpr int value = T == GGUF_Q6_K ? 4 : GgufBlocks<T>::K_QUANT ? 2 : 1;
};

template <int T>
__device__ __forceinline__ GgufBlocks<T> bank_matrix(const GgufBlocks<T>& w, int e, int N, int K) {
    return GgufBlocks<T>{w.data + (long long)e * N * GgufBlocks<T>::row_bytes(K)};
}

// This lane's bytes of one chunk and row: `codes` the 8 bytes holding its elements' low bits, `high` those
// holding their high bits (Q5_K, Q6_K: 8 bytes; Q5_0, Q5_1: the block's 32 high bits shifted to the lane's
// first element).
struct GgufChunk {
    uint2 codes, high;
};

__device__ __forceinline__ unsigned ld_u16(const unsigned char* p) {
    return (unsigned)__ldg(reinterpret_cast<const unsigned short*>(p));
}
__device__ __forceinline__ unsigned ld_u32_by_halves(const unsigned char* p) { return ld_u16(p) | (ld_u16(p + 2) << 16); }
__device__ __forceinline__ uint2 ld_8_by_halves(const unsigned char* p) {
    return make_uint2(ld_u32_by_halves(p), ld_u32_by_halves(p + 4));
}

// The bytes for elements k .. k + 7 (k % 8 == 0, inside the row) of the row starting at `row`, without tests.
template <int T>
__device__ __forceinline__ GgufChunk gguf_chunk_in(const unsigned char* __restrict__ row, int k, int K) {
    GgufChunk c{make_uint2(0u, 0u), make_uint2(0u, 0u)};
    using B = GgufBlocks<T>;
    const unsigned char* block = row + (long long)(k / B::BLOCK) * B::BYTES;
    const int l = k & 31, sub = (k % B::BLOCK) >> 5;
    if constexpr (B::APART) {
        c.codes = __ldg(reinterpret_cast<const uint2*>(row + (k >> 5) * 16 + (l & 15)));
        if constexpr (B::HIGH_BITS)
            c.high.x = __ldg(reinterpret_cast<const unsigned*>(row + B::high_bits_at(K) + (k >> 5) * 4)) >> l;
    } else if constexpr (T == GGUF_Q4_K) {
        c.codes = __ldg(reinterpret_cast<const uint2*>(block + 16 + 32 * (sub >> 1) + l));
    } else if constexpr (T == GGUF_Q5_K) {
        c.codes = __ldg(reinterpret_cast<const uint2*>(block + 48 + 32 * (sub >> 1) + l));
        c.high = __ldg(reinterpret_cast<const uint2*>(block + 16 + l));
    } else {  // Q6_K: sub-block = half h (128 elements) and quarter r
        const int h = sub >> 2, r = sub & 3;
        c.codes = ld_8_by_halves(block + 64 * h + 32 * (r & 1) + l);
        c.high = ld_8_by_halves(block + 128 + 32 * h + l);
    }
    return c;
}

// This lane's bytes of chunks c .. c + G - 1 (G = ChunksPerLoad, c a multiple of G, inside the row at `row`): the
// bytes they share loaded once.
template <int T, int G>
__device__ __forceinline__ void gguf_chunks_in(const unsigned char* __restrict__ row, int c, int K,
                                               GgufChunk (&out)[G]) {
    if constexpr (T == GGUF_Q6_K) {
        out[0] = gguf_chunk_in<T>(row, lane_k(c, K), K);
        out[1] = GgufChunk{gguf_chunk_in<T>(row, lane_k(c + 1, K), K).codes, out[0].high};
        out[2] = out[0];
        out[3] = out[1];
    } else {
        out[0] = gguf_chunk_in<T>(row, lane_k(c, K), K);
#pragma unroll
        for (int h = 1; h < G; ++h) out[h] = out[0];
    }
}

// Row `row`'s bytes for elements k .. k + 7 (k % 8 == 0; zeros outside the matrix).
template <int T>
__device__ __forceinline__ GgufChunk gguf_chunk(const unsigned char* __restrict__ w, int row, int rows, int k, int K) {
    if (row < 0 || row >= rows || k >= K) return GgufChunk{make_uint2(0u, 0u), make_uint2(0u, 0u)};
    return gguf_chunk_in<T>(w + row * GgufBlocks<T>::row_bytes(K), k, K);
}

// Bytes 2t and 2t + 1 of 8 bytes in the low bytes of a pair's two halves.
__device__ __forceinline__ unsigned byte_pair(uint2 v, int t) {
    return __byte_perm(t < 2 ? v.x : v.y, 0u, (t & 1) ? 0x4342 : 0x4140);
}

// A pair of codes (each half below 128) as the bf16 pair of code - bias: 128 + code is a bf16 exactly (0x43 and
// 7 mantissa bits), and one bf16 fma by 1 adding -(128 + bias) gives the small integer exactly.
__device__ __forceinline__ unsigned codes_to_bf16x2(unsigned codes, unsigned neg_bias) {
    unsigned d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(codes | 0x43004300u), "r"(0x3f803f80u), "r"(neg_bias));
    return d;
}

// This lane's operand of chunk `sub` (its sub-block within a super-block; 0 for 32-element blocks): elements
// 2t, 2t + 1 in w[t].
template <int T>
__device__ __forceinline__ Frag8 gguf_operand(const GgufChunk& c, int sub, int lane_q) {
    Frag8 b;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        unsigned n;
        if constexpr (T == GGUF_Q4_0 || T == GGUF_Q4_1 || T == GGUF_Q5_0 || T == GGUF_Q5_1) {
            n = (byte_pair(c.codes, t) >> ((lane_q >> 1) * 4)) & 0x000f000fu;  // elements 16-31: high nibbles
            if constexpr (T == GGUF_Q5_0 || T == GGUF_Q5_1)
                n |= (((c.high.x >> (2 * t)) & 1u) << 4) | (((c.high.x >> (2 * t + 1)) & 1u) << 20);
        } else if constexpr (T == GGUF_Q4_K || T == GGUF_Q5_K) {
            n = (byte_pair(c.codes, t) >> (4 * (sub & 1))) & 0x000f000fu;
            if constexpr (T == GGUF_Q5_K) n |= ((byte_pair(c.high, t) >> sub) & 0x00010001u) << 4;
        } else {
            const int r = sub & 3;
            n = ((byte_pair(c.codes, t) >> (4 * (r >> 1))) & 0x000f000fu) |
                (((byte_pair(c.high, t) >> (2 * r)) & 0x00030003u) << 4);
        }
        b.w[t] = codes_to_bf16x2(n, GgufBlocks<T>::NEG_BIAS);
    }
    return b;
}

// Column `col`'s coefficients for chunk c of a Q6_K weight or one laid out apart (Q4_0 ... Q5_1): s, and the
// factor of the chunk's second part (Q6_K: s of its second half; else o, the offset m or 0); zeros past the
// matrix. Q4_K / Q5_K take theirs from cached headers (`k_quant_coefficients`).
template <int T>
__device__ __forceinline__ void gguf_coefficients(const unsigned char* __restrict__ w, int col, int N, int c, int K,
                                                  float& s, float& second) {
    using B = GgufBlocks<T>;
    static_assert(T == GGUF_Q6_K || B::APART, "Q4_K / Q5_K: k_quant_coefficients");
    s = second = 0.0f;
    if (col >= N) return;
    if constexpr (T == GGUF_Q6_K) {
        const int k = c * 32, sub = (k % B::BLOCK) >> 5;
        const unsigned char* block = w + col * B::row_bytes(K) + (long long)(k / B::BLOCK) * B::BYTES;
        const float d = f16_bits_to_float(ld_u16(block + 208));
        const int j = 8 * (sub >> 2) + 2 * (sub & 3);
        s = d * (float)(signed char)__ldg(block + 192 + j);
        second = d * (float)(signed char)__ldg(block + 192 + j + 1);
    } else {  // the chunk's block's d (and m) among the row's coefficients
        const unsigned char* d = w + col * B::row_bytes(K) + B::coefficients_at(K) + c * (B::OFFSET ? 4 : 2);
        s = f16_bits_to_float(ld_u16(d));
        if constexpr (B::OFFSET) second = f16_bits_to_float(ld_u16(d + 2));
    }
}

// Q4_K / Q5_K: a column's super-block header (d, dmin and the 12 packed scale bytes: the block's first 16 bytes,
// 16-byte aligned as the blocks are 144 and 176 bytes), loaded once for the block's 8 chunks; zeros past the matrix.
__device__ __forceinline__ uint4 k_quant_header(const unsigned char* __restrict__ w, long long row_bytes, int col,
                                                int N, int block, int bytes) {
    return col < N ? __ldg(reinterpret_cast<const uint4*>(w + col * row_bytes + (long long)block * bytes))
                   : make_uint4(0u, 0u, 0u, 0u);
}

// Sub-block j's s = d sc and o = -dmin mn from a header (GGML's get_scale_min_k4 on the bytes in registers).
__device__ __forceinline__ void k_quant_coefficients(const uint4& h, int j, float& s, float& o) {
    auto byte = [&](int i) { return ((i < 4 ? h.y : i < 8 ? h.z : h.w) >> (8 * (i & 3))) & 0xffu; };
    const unsigned sc = j < 4 ? byte(j) & 63u : (byte(j + 4) & 0xfu) | ((byte(j - 4) >> 6) << 4);
    const unsigned mn = j < 4 ? byte(j + 4) & 63u : (byte(j + 4) >> 4) | ((byte(j) >> 6) << 4);
    s = f16_bits_to_float(h.x & 0xffffu) * (float)sc;
    o = -(f16_bits_to_float(h.x >> 16) * (float)mn);
}

// acc += the products of chunks c_begin .. c_end - 1 of a GGUF block weight, chunk by chunk in order.
template <int MT, int NT, int U, int VEC, int T>
__device__ __forceinline__ void accumulate(const bf16_t* __restrict__ x, long long ldx, const int* __restrict__ x_rows,
                                           const GgufBlocks<T>& w, int m0, int M, int n0, int N, int K, int c_begin,
                                           int c_end, float (&acc)[MT][NT][4]) {
    using B = GgufBlocks<T>;
    using Frags = FragMap<VEC, NT>;
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    // Q4_K / Q5_K: the columns' headers of the current super-block (header_block), reloaded as a block starts.
    uint4 header[NT][Frags::COLUMNS];
    int header_block = -1;
    const unsigned char* w_rows[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) w_rows[j] = w.data + min(n0 + j * 8 + g, N - 1) * B::row_bytes(K);
    chunk_batches<MT, NT, U, ChunksPerLoad<GgufBlocks<T>>::value, VEC, GgufChunk>(
        x, ldx, x_rows, m0, M, K, c_begin, c_end, n0 + NT * 8 <= N,
        [&](int c, int j, GgufChunk(&raw)[ChunksPerLoad<GgufBlocks<T>>::value], auto checked) {
            constexpr int G = ChunksPerLoad<GgufBlocks<T>>::value;
            if constexpr (decltype(checked)::value) {
#pragma unroll
                for (int h = 0; h < G; ++h)
                    raw[h] = gguf_chunk<T>(w.data, n0 + j * 8 + g, N, lane_k(c < 0 ? c : c + h, K), K);
            } else {
                gguf_chunks_in<T, G>(w_rows[j], c, K, raw);
            }
        },
        [&](int c, const GgufChunk (&raw)[NT], const Frag8 (&a)[MT][2]) {
            const int sub = (c * 32 % B::BLOCK) >> 5;
            if constexpr (T == GGUF_Q4_K || T == GGUF_Q5_K) {
                if (c / 8 != header_block) {
                    header_block = c / 8;
#pragma unroll
                    for (int j = 0; j < NT; ++j)
#pragma unroll
                        for (int p = 0; p < Frags::COLUMNS; ++p)
                            header[j][p] = k_quant_header(w.data, B::row_bytes(K), n0 + Frags::column(j, p), N,
                                                          header_block, B::BYTES);
                }
            }
            Frag8 b[NT];
#pragma unroll
            for (int j = 0; j < NT; ++j) b[j] = gguf_operand<T>(raw[j], sub, q);
            // parts[0]: the chunk's products (Q6_K: elements 0-15's); parts[1]: Q6_K's elements 16-31, or the
            // chunk's sums of x (a row's sum in every column) for formats with an offset.
            float parts[2][MT][NT][4];
            zero_frags<MT, NT>(parts[0]);
            zero_frags<MT, NT>(parts[1]);
            if constexpr (T == GGUF_Q6_K) {
                Frag8 lo[NT], hi[NT];
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    lo[j] = q < 2 ? b[j] : Frag8{{0u, 0u, 0u, 0u}};
                    hi[j] = q < 2 ? Frag8{{0u, 0u, 0u, 0u}} : b[j];
                }
                mma_chunk<MT, NT, VEC>(parts[0], a, lo);
                mma_chunk<MT, NT, VEC>(parts[1], a, hi);
            } else {
                mma_chunk<MT, NT, VEC>(parts[0], a, b);
                if constexpr (B::OFFSET) {
                    Frag8 ones[NT];
#pragma unroll
                    for (int j = 0; j < NT; ++j) ones[j] = Frag8{{0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u}};
                    mma_chunk<MT, NT, VEC>(parts[1], a, ones);
                }
            }
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int p = 0; p < Frags::COLUMNS; ++p) {
                    float s, second;
                    if constexpr (T == GGUF_Q4_K || T == GGUF_Q5_K)
                        k_quant_coefficients(header[j][p], sub, s, second);
                    else
                        gguf_coefficients<T>(w.data, n0 + Frags::column(j, p), N, c, K, s, second);
                    add_column<MT, NT, VEC>(acc, parts[0], j, p, s);
                    add_column<MT, NT, VEC>(acc, parts[1], j, p, second);
                }
        });
}

#if defined(GGUF_TYPE)
#if GGUF_TYPE == GGUF_Q4_0
#define GGUF_KERNELS(ROWS_KERNELS) ROWS_KERNELS(gemm_gguf_q4_0, GgufBlocks<GGUF_Q4_0>)
#elif GGUF_TYPE == GGUF_Q4_1
#define GGUF_KERNELS(ROWS_KERNELS) ROWS_KERNELS(gemm_gguf_q4_1, GgufBlocks<GGUF_Q4_1>)
#elif GGUF_TYPE == GGUF_Q5_0
#define GGUF_KERNELS(ROWS_KERNELS) ROWS_KERNELS(gemm_gguf_q5_0, GgufBlocks<GGUF_Q5_0>)
#elif GGUF_TYPE == GGUF_Q5_1
#define GGUF_KERNELS(ROWS_KERNELS) ROWS_KERNELS(gemm_gguf_q5_1, GgufBlocks<GGUF_Q5_1>)
#elif GGUF_TYPE == GGUF_Q4_K
#define GGUF_KERNELS(ROWS_KERNELS) ROWS_KERNELS(gemm_gguf_q4_k, GgufBlocks<GGUF_Q4_K>)
#elif GGUF_TYPE == GGUF_Q5_K
#define GGUF_KERNELS(ROWS_KERNELS) ROWS_KERNELS(gemm_gguf_q5_k, GgufBlocks<GGUF_Q5_K>)
#elif GGUF_TYPE == GGUF_Q6_K
#define GGUF_KERNELS(ROWS_KERNELS) ROWS_KERNELS(gemm_gguf_q6_k, GgufBlocks<GGUF_Q6_K>)
#endif
#endif
