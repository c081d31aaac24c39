// The tile of the bf16 GEMMs: out[M, N] = x[M, K] @ w[N, K]^T (+ bias[N]), bf16 in and out, fp32 accumulation on
// the tensor cores through mma.sync.m16n8k16 (sm_80 and later: Hopper and GB10 alike). Used by gemm.cu (dense
// products) and moe.cu (products over tokens grouped by expert).
//
// Batch invariance: every output element is computed the same way whatever M is and wherever its row
// sits. The K axis is cut into 32-wide chunks; warp w of the block (GEMM_KSPLIT warps) sums a fixed
// contiguous range of chunks that depends only on K (and the weight kind's ChunksPerLoad), in order; the block
// then adds the warps' partial sums in warp order. The tile shape (MT x 16 rows, NT x 8 columns) only decides
// which elements a block computes together, so the host picks it freely for occupancy.
//
// Fragments are loaded straight from global memory, 16 bytes per thread: thread (g = lane / 4,
// q = lane % 4) holds elements k0 + 8q .. k0 + 8q + 7 of its row. The mma's logical k index is permuted
// consistently for A and B (logical 2q, 2q+1 <-> 8q + 4s, 8q + 4s + 1 and logical 2q+8, 2q+9 <->
// 8q + 4s + 2, 8q + 4s + 3 in step s of the chunk), which leaves the dot product unchanged.
//
// VEC, the load mode of a kernel: 0 loads element by element (any K and alignment); 1 loads 16 bytes of x per
// thread and the weight in vectors (K % 8 == 0, aligned rows); VEC_LOW8 is 1 for products of at most 8 rows an
// m-tile (decode), where the x fragments of rows 8 .. 15 are zeros known when compiling: half the x registers,
// more weight bytes in flight. Rows 0 .. 7 give the same bits in every mode.
//
// The weight operand is bf16 (`const bf16_t*`) here; quantized weights bring their own `accumulate` (gemm_fp8.cuh,
// gemm_nvfp4.cuh, gemm_gguf.cuh).
#pragma once
#include "fp8.cuh"
#include "mma_frags.cuh"

#define VEC_LOW8 2

#ifndef GEMM_KSPLIT
#define GEMM_KSPLIT 8
#endif

struct Frag8 {
    unsigned w[4];  // 8 bf16: w[i] holds elements 2i (low half) and 2i+1 (high half)
};

// Elements k .. k+7 of `row`; zeros outside rows x K (and for row -1). VEC: 16-byte loads (K % 8 == 0, aligned rows).
template <int VEC>
__device__ __forceinline__ Frag8 load8(const bf16_t* base, long long ld, int row, int rows, int k, int K) {
    Frag8 f;
    f.w[0] = f.w[1] = f.w[2] = f.w[3] = 0u;
    if (row >= 0 && row < rows && k < K) {
        const bf16_t* p = base + (long long)row * ld + k;
        if (VEC) {
            const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
            f.w[0] = v.x;
            f.w[1] = v.y;
            f.w[2] = v.z;
            f.w[3] = v.w;
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const unsigned lo = (k + 2 * e < K) ? (unsigned)p[2 * e] : 0u;
                const unsigned hi = (k + 2 * e + 1 < K) ? (unsigned)p[2 * e + 1] : 0u;
                f.w[e] = lo | (hi << 16);
            }
        }
    }
    return f;
}

// The 16 bytes at p (16-byte aligned) as a fragment, without tests.
__device__ __forceinline__ Frag8 frag_at(const void* p) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    return Frag8{{v.x, v.y, v.z, v.w}};
}

// Matrix e of a bank [E, N, K].
__device__ __forceinline__ const bf16_t* bank_matrix(const bf16_t* w, int e, int N, int K) {
    return w + (long long)e * N * K;
}
// The x row that product row r reads (r itself without a gather); -1 (no row: zeros) for rows past M.
__device__ __forceinline__ int gathered_row(const int* __restrict__ x_rows, int r, int M) {
    return r >= M ? -1 : (x_rows ? x_rows[r] : r);
}

// acc = 0 for every fragment of an (MT x 16) x (NT x 8) tile.
template <int MT, int NT>
__device__ __forceinline__ void zero_frags(float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
}

// This lane's x rows for the MT m-tiles at rows m0..: rows g and g + 8 of each (nullptr: no row, zeros; rows
// g + 8 are compile-time zeros for VEC_LOW8), resolved once per tile.
template <int MT, int VEC>
struct XRows {
    const bf16_t* row[MT][2];

    __device__ __forceinline__ XRows(const bf16_t* __restrict__ x, long long ldx, const int* __restrict__ x_rows,
                                     int m0, int M, int g) {
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = gathered_row(x_rows, m0 + i * 16 + g + 8 * h, M);
                row[i][h] = (VEC == VEC_LOW8 && h == 1) || r < 0 ? nullptr : x + (long long)r * ldx;
            }
    }

    // The fragments of elements k .. k + 7 (k = K: zeros). Checked: elements past K read as zeros; unchecked
    // (VEC kernels, k + 8 <= K): one 16-byte load a row.
    template <bool Checked>
    __device__ __forceinline__ void load(Frag8 (&a)[MT][2], int k, int K) const {
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if (Checked || !row[i][h])
                    a[i][h] = load8<VEC>(row[i][h], 0, row[i][h] ? 0 : -1, 1, k, K);
                else
                    a[i][h] = frag_at(row[i][h] + k);
            }
    }
};

// A compile-time flag for the chunk loop's loads: Checked<true> tests rows and K, Checked<false> (a batch whose
// chunks, groups and rows all lie inside the matrix) does not.
template <bool B>
struct Checked {
    static constexpr bool value = B;
};

// Where the fragments acc[i][j][e] of a chunk loop sit in its (MT x 16) x (NT x 8) tile, for load mode VEC and NT
// n-tiles (g = lane / 4, q = lane % 4).
// - Standard: the mma's rows are x rows. acc[i][j][e] holds row 16 i + g + (e & 2 ? 8 : 0), column 8 j + 2 q + (e & 1).
// - Swapped (decode: VEC_LOW8 with NT even): the weight's columns are the mma's rows and the x rows its columns, so a
//   pair of n-tiles takes one mma step instead of two, with no fragment of zero rows. acc[i][j][e] holds row 16 i +
//   2 q + e, column 8 j + g, for e < 2; e >= 2 holds nothing. `to_standard` moves them where Standard has them.
// Each output element sums the same products in the same order either way.
template <int VEC, int NT>
struct FragMap {
    static constexpr bool SWAPPED = VEC == VEC_LOW8 && NT % 2 == 0;
    // How many distinct columns of an n-tile a lane holds.
    static constexpr int COLUMNS = SWAPPED ? 1 : 2;

    // The tile column of this lane's p-th column (p < COLUMNS) of n-tile j.
    __device__ static __forceinline__ int column(int j, int p) {
        const int lane = threadIdx.x & 31;
        return 8 * j + (SWAPPED ? lane >> 2 : 2 * (lane & 3) + p);
    }

    // Which of this lane's columns of its n-tile element e lies in; -1: the element holds nothing.
    __device__ static constexpr int column_of(int e) { return SWAPPED ? (e < 2 ? 0 : -1) : (e & 1); }
};

// acc[i][j][e] += part[i][j][e] * s for the elements in this lane's p-th column of n-tile j (FragMap).
template <int MT, int NT, int VEC>
__device__ __forceinline__ void add_column(float (&acc)[MT][NT][4], const float (&part)[MT][NT][4], int j, int p,
                                           float s) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (FragMap<VEC, NT>::column_of(e) == p) acc[i][j][e] = __fmaf_rn(part[i][j][e], s, acc[i][j][e]);
}

// acc[i][j] += one 32-wide chunk's products of x fragments a and weight fragments b, two mma steps, in the layout
// FragMap<VEC, NT> gives.
template <int MT, int NT, int VEC>
__device__ __forceinline__ void mma_chunk(float (&acc)[MT][NT][4], const Frag8 (&a)[MT][2], const Frag8 (&b)[NT]) {
#pragma unroll
    for (int s = 0; s < 2; ++s)
#pragma unroll
        for (int i = 0; i < MT; ++i) {
            if constexpr (FragMap<VEC, NT>::SWAPPED) {
#pragma unroll
                for (int j = 0; j < NT; j += 2)
                    mma_16816(acc[i][j][0], acc[i][j][1], acc[i][j + 1][0], acc[i][j + 1][1], b[j].w[2 * s],
                              b[j + 1].w[2 * s], b[j].w[2 * s + 1], b[j + 1].w[2 * s + 1], a[i][0].w[2 * s],
                              a[i][0].w[2 * s + 1]);
            } else {
#pragma unroll
                for (int j = 0; j < NT; ++j)
                    mma_16816(acc[i][j], a[i][0].w[2 * s], a[i][1].w[2 * s], a[i][0].w[2 * s + 1],
                              a[i][1].w[2 * s + 1], b[j].w[2 * s], b[j].w[2 * s + 1]);
            }
        }
}

// Swapped fragments (FragMap) moved to the Standard layout within the warp: the element of row g, column 2 q + e
// of n-tile j comes from lane 4 (2 q + e) + g / 2, which holds it as its element g % 2. All lanes take part.
template <int MT, int NT>
__device__ __forceinline__ void to_standard(float (&acc)[MT][NT][4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            float v[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int from = 4 * (2 * q + e) + (g >> 1);
                const float even = __shfl_sync(0xffffffffu, acc[i][j][0], from);
                const float odd = __shfl_sync(0xffffffffu, acc[i][j][1], from);
                v[e] = g & 1 ? odd : even;
            }
            acc[i][j][0] = v[0];
            acc[i][j][1] = v[1];
            acc[i][j][2] = acc[i][j][3] = 0.0f;
        }
}

// How many consecutive chunks one weight load of a lane covers (`chunk_batches`' G) for weight type W: 1 for
// bf16 (16 bytes a chunk already); the quantized kinds specialise it so that a lane's load is 16 bytes, or (the
// K-quants) so that bytes which consecutive chunks share are loaded once.
template <typename W>
struct ChunksPerLoad {
    static constexpr int value = 1;
};

// This lane's first element of chunk c (elements c * 32 + 8q .. + 7; q = lane % 4); K, nothing, for c < 0.
__device__ __forceinline__ int lane_k(int c, int K) { return c < 0 ? K : c * 32 + (threadIdx.x & 3) * 8; }

// The chunk loop every weight kind shares: chunks c_begin .. c_end - 1 in order, max(U, G) at a time (c_begin a
// multiple of G, and U too when larger), each batch's weight operands and x fragments loaded before any is
// multiplied. load(c, j, raw, checked) fills raw[0 .. G - 1] with this lane's operands of chunks c .. c + G - 1
// for n-tile j (one load where the kind can: `ChunksPerLoad`); c = -1 past the range: zeros; checked is
// Checked<false> only where the batch's chunks lie inside K and the tile's weight rows inside the matrix
// (rows_inside), so that the load needs no tests. multiply(c, raw[NT], a) then takes chunk c. Row r of the
// product reads row x_rows[r] of x when x_rows is given, else row r.
template <int MT, int NT, int U, int G, int VEC, typename Raw, typename Load, typename Multiply>
__device__ __forceinline__ void chunk_batches(const bf16_t* __restrict__ x, long long ldx,
                                              const int* __restrict__ x_rows, int m0, int M, int K, int c_begin,
                                              int c_end, bool rows_inside, Load load, Multiply multiply) {
    constexpr int B = U < G ? G : U;  // chunks a batch
    static_assert(B % G == 0, "a batch holds whole loads");
    const XRows<MT, VEC> xr(x, ldx, x_rows, m0, M, (threadIdx.x & 31) >> 2);
    auto batch = [&](int c, auto checked) {
        constexpr bool CHECKED = decltype(checked)::value;
        Raw raw[B][NT];
        Frag8 a[B][MT][2];
#pragma unroll
        for (int u = 0; u < B; u += G) {
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                Raw loaded[G];
                load(!CHECKED || c + u < c_end ? c + u : -1, j, loaded, checked);
#pragma unroll
                for (int h = 0; h < G; ++h) raw[u + h][j] = loaded[h];
            }
#pragma unroll
            for (int h = 0; h < G; ++h)
                xr.template load<CHECKED>(a[u + h], lane_k(!CHECKED || c + u + h < c_end ? c + u + h : -1, K), K);
        }
#pragma unroll
        for (int u = 0; u < B; ++u)
            if (!CHECKED || c + u < c_end) multiply(c + u, raw[u], a[u]);
    };
    for (int c = c_begin; c < c_end; c += B) {
        if (VEC && rows_inside && c + B <= c_end && (c + B) * 32 <= K)
            batch(c, Checked<false>{});
        else
            batch(c, Checked<true>{});
    }
}

// acc[i][j] (this lane's fragments of the tile at rows m0..) += the products of the 32-wide K chunks [c_begin,
// c_end) of a bf16 weight of `rows` rows whose n-tile j starts at row tile_row(j), chunk after chunk in order, two
// mma steps each (chunk_batches); rows_inside: every tile row lies inside the weight. The fragments are in
// FragMap<VEC, NT>'s layout: swapped for VEC_LOW8 with NT even, which tile_partials undoes.
template <int MT, int NT, int U, int VEC, typename TileRow>
__device__ __forceinline__ void mma_chunks_of_rows(const bf16_t* __restrict__ x, long long ldx,
                                                   const int* __restrict__ x_rows, const bf16_t* __restrict__ w,
                                                   int rows, TileRow tile_row, bool rows_inside, int m0, int M, int K,
                                                   int c_begin, int c_end, float (&acc)[MT][NT][4]) {
    const int g = (threadIdx.x & 31) >> 2;
    const bf16_t* w_rows[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) w_rows[j] = w + (long long)min(tile_row(j) + g, rows - 1) * K;
    chunk_batches<MT, NT, U, 1, VEC, Frag8>(
        x, ldx, x_rows, m0, M, K, c_begin, c_end, rows_inside,
        [&](int c, int j, Frag8(&b)[1], auto checked) {
            if constexpr (decltype(checked)::value)
                b[0] = load8<VEC>(w, K, tile_row(j) + g, rows, lane_k(c, K), K);
            else
                b[0] = frag_at(w_rows[j] + lane_k(c, K));
        },
        [&](int, const Frag8 (&b)[NT], const Frag8 (&a)[MT][2]) { mma_chunk<MT, NT, VEC>(acc, a, b); });
}

// mma_chunks_of_rows for the tile at columns n0.. of an [N, K] weight (n-tile j at row n0 + 8 j).
template <int MT, int NT, int U, int VEC>
__device__ __forceinline__ void mma_chunks(const bf16_t* __restrict__ x, long long ldx, const int* __restrict__ x_rows,
                                           const bf16_t* __restrict__ w, int m0, int M, int n0, int N, int K,
                                           int c_begin, int c_end, float (&acc)[MT][NT][4]) {
    mma_chunks_of_rows<MT, NT, U, VEC>(x, ldx, x_rows, w, N, [n0](int j) { return n0 + j * 8; }, n0 + NT * 8 <= N, m0,
                                       M, K, c_begin, c_end, acc);
}

// The products of a bf16 weight (mma_chunks); the quantized kinds' overloads are in their own headers
// (gemm_fp8.cuh, gemm_nvfp4.cuh, gemm_gguf.cuh), found for their weight types where gemm_tile is instantiated.
template <int MT, int NT, int U, int VEC>
__device__ __forceinline__ void accumulate(const bf16_t* __restrict__ x, long long ldx, const int* __restrict__ x_rows,
                                           const bf16_t* __restrict__ w, int m0, int M, int n0, int N, int K,
                                           int c_begin, int c_end, float (&acc)[MT][NT][4]) {
    mma_chunks<MT, NT, U, VEC>(x, ldx, x_rows, w, m0, M, n0, N, K, c_begin, c_end, acc);
}
// Each warp's sums over its fixed K range for the (MT x 16) x (NT x 8) tile at rows m0.. and columns n0..:
// partials[warp][fragment][lane], fragment f = (i * NT + j) * 4 + e holding row m0 + 16 i + lane / 4 + (e & 2 ?
// 8 : 0), column n0 + 8 j + 2 (lane % 4) + (e & 1). The block is synchronised on return; tile_sum adds a
// fragment's partials in warp order. Row r of the product reads row x_rows[r] of x when x_rows is given, else
// row r; rows at or past M read zeros.
template <int MT, int NT>
struct TilePartials {
    float v[GEMM_KSPLIT][MT * NT * 4][32];
};

template <int MT, int NT, int U, int VEC, typename W>
__device__ __forceinline__ void tile_partials(TilePartials<MT, NT>& partials, const bf16_t* __restrict__ x,
                                              long long ldx, const int* __restrict__ x_rows, const W w, int m0, int M,
                                              int n0, int N, int K) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int chunks = (K + 31) / 32;
    constexpr int G = ChunksPerLoad<W>::value;
    const int per_warp = ((chunks + GEMM_KSPLIT - 1) / GEMM_KSPLIT + G - 1) / G * G;
    const int c_begin = warp * per_warp;
    const int c_end = min(chunks, c_begin + per_warp);

    float acc[MT][NT][4];
    zero_frags<MT, NT>(acc);

    accumulate<MT, NT, U, VEC>(x, ldx, x_rows, w, m0, M, n0, N, K, c_begin, c_end, acc);
    if constexpr (FragMap<VEC, NT>::SWAPPED) to_standard<MT, NT>(acc);

#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) partials.v[warp][(i * NT + j) * 4 + e][lane] = acc[i][j][e];
    __syncthreads();
}

template <int MT, int NT>
__device__ __forceinline__ float tile_sum(const TilePartials<MT, NT>& partials, int f, int lane) {
    float sum = partials.v[0][f][lane];
#pragma unroll
    for (int w = 1; w < GEMM_KSPLIT; ++w) sum = __fadd_rn(sum, partials.v[w][f][lane]);
    return sum;
}

// One (MT x 16) x (NT x 8) output tile at rows m0.. and columns n0..: rows below M are computed. Row r of the
// product reads row x_rows[r] of x when x_rows is given (a gather, e.g. tokens grouped by expert), else row r;
// it is written to row r of out. A row's result depends only on its x row, w and K, never on m0 or M.
template <int MT, int NT, int U, int VEC, typename W>
__device__ __forceinline__ void gemm_tile(const bf16_t* __restrict__ x, long long ldx, const int* __restrict__ x_rows,
                                          const W w, const bf16_t* __restrict__ bias,
                                          bf16_t* __restrict__ out, long long ldo, int m0, int M, int n0, int N, int K) {
    __shared__ TilePartials<MT, NT> partials;
    tile_partials<MT, NT, U, VEC, W>(partials, x, ldx, x_rows, w, m0, M, n0, N, K);
    for (int idx = threadIdx.x; idx < MT * NT * 4 * 32; idx += blockDim.x) {
        const int f = idx >> 5, l = idx & 31;
        const int e = f & 3, ij = f >> 2, i = ij / NT, j = ij % NT;
        const int row = m0 + i * 16 + (l >> 2) + ((e & 2) ? 8 : 0);
        const int col = n0 + j * 8 + 2 * (l & 3) + (e & 1);
        if (row < M && col < N) {
            float sum = tile_sum<MT, NT>(partials, f, l);
            if (bias) sum = __fadd_rn(sum, bf16_to_float(bias[col]));
            out[(long long)row * ldo + col] = float_to_bf16(sum);
        }
    }
}
