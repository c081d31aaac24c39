// A gated feed-forward's first product with its gate applied, for gemm.cu's decode-sized gated kernels: the weight
// as the chunk loop reads it (GatedRows: each tile's gate n-tiles, then the up n-tiles of the same units) and the
// tile with the gate in its epilogue (gated_tile).
#pragma once
#include "gemm_core.cuh"

// A gated feed-forward's bf16 weight [2 inner, K] = [gate | up] as gated_tile reads it: a tile at units n0.. takes
// the gate rows n0 + 8 j in its first NT / 2 n-tiles and the up rows inner + n0 + 8 j of the same units in the rest.
struct GatedRows {
    const bf16_t* w;
    int inner;
};

template <int MT, int NT, int U, int VEC>
__device__ __forceinline__ void accumulate(const bf16_t* __restrict__ x, long long ldx, const int* __restrict__ x_rows,
                                           const GatedRows w, int m0, int M, int n0, int, int K, int c_begin,
                                           int c_end, float (&acc)[MT][NT][4]) {
    static_assert(NT % 2 == 0, "a gated tile pairs its gate and up n-tiles");
    const int inner = w.inner;
    const auto tile_row = [n0, inner](int j) { return j < NT / 2 ? n0 + j * 8 : inner + n0 + (j - NT / 2) * 8; };
    mma_chunks_of_rows<MT, NT, U, VEC>(x, ldx, x_rows, w.w, 2 * inner, tile_row, n0 + NT / 2 * 8 <= inner, m0, M, K,
                                       c_begin, c_end, acc);
}

// One (MT x 16) x (NT / 2 x 8) tile of a gated feed-forward's first product at rows m0.. and units n0.. (of `inner`):
// out = act(gate) * up, each product (+ its bias: gate at the unit, up at inner + the unit) rounded to bf16 first,
// as gemm_tile followed by elementwise.cu's gated kernel computes it (the same sums, so the same bits).
template <int MT, int NT, int U, int VEC, typename Gate>
__device__ __forceinline__ void gated_tile(const bf16_t* __restrict__ x, long long ldx, const GatedRows w,
                                           const bf16_t* __restrict__ bias, bf16_t* __restrict__ out, long long ldo,
                                           int m0, int M, int n0, int K, Gate gate) {
    __shared__ TilePartials<MT, NT> partials;
    const int inner = w.inner;
    tile_partials<MT, NT, U, VEC, GatedRows>(partials, x, ldx, nullptr, w, m0, M, n0, inner, K);
    constexpr int HALF = NT / 2;
    for (int idx = threadIdx.x; idx < MT * HALF * 4 * 32; idx += blockDim.x) {
        const int f = idx >> 5, l = idx & 31;
        const int e = f & 3, ij = f >> 2, i = ij / HALF, j = ij % HALF;
        const int row = m0 + i * 16 + (l >> 2) + ((e & 2) ? 8 : 0);
        const int col = n0 + j * 8 + 2 * (l & 3) + (e & 1);
        if (row < M && col < inner) {
            float g = tile_sum<MT, NT>(partials, (i * NT + j) * 4 + e, l);
            float u = tile_sum<MT, NT>(partials, (i * NT + j + HALF) * 4 + e, l);
            if (bias) {
                g = __fadd_rn(g, bf16_to_float(bias[col]));
                u = __fadd_rn(u, bf16_to_float(bias[inner + col]));
            }
            const float gr = bf16_to_float(float_to_bf16(g)), ur = bf16_to_float(float_to_bf16(u));
            out[(long long)row * ldo + col] = float_to_bf16(gate(gr) * ur);
        }
    }
}
