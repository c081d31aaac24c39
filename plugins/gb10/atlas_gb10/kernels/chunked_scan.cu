// The chunked forms of the recurrences of the hybrid models, for prefill on the tensor cores: the gated delta rule
// (the WY / UT transform of DeltaNet, as flash-linear-attention runs it) and Mamba-2's selective scan (SSD), with the
// tokens of a sequence taken 64 at a time instead of one at a time as recurrent.cu's kernels take them.
//
// Gated delta rule. Within a chunk of L <= 64 tokens (G = the cumulative sum of g from the chunk start, q^ / k^ the
// normalised q / k, q^ scaled), the state S [Dk, Dv] entering it and
//     A[t, s] = beta_t exp(G_t - G_s) k^_t . k^_s  (s < t, else 0),   T = (I + A)^-1  (unit lower triangular)
//     W = T (beta exp(G) k^),   U = T (beta v),   delta = U - W S
//     o_t = exp(G_t) q^_t S + sum_{s <= t} exp(G_t - G_s) (q^_t . k^_s) delta_s
//     S' = exp(G_L) S + sum_s exp(G_L - G_s) k^_s delta_s^T
// which is the recurrence of the rule unrolled over the chunk (atlas_core.backends.ops.gated_delta's
// gated_delta_chunked is its float64-checked reference).
// Mamba-2 is the same computation without the delta correction (T = I, no W S), with q = C, k = B, v = x (a head's
// P dims), Dk = N, the log decay g = delta A, beta = delta, no norms, and the skip o += D x:
//     o_t = exp(G_t) C_t h + sum_{s <= t} exp(G_t - G_s) (C_t . B_s) delta_s x_s + D x_t,
//     h' = exp(G_L) h + sum_s exp(G_L - G_s) B_s (delta_s x_s)^T   (h [N, P]: the state transposed).
// Every exp has a non-positive argument (g <= 0).
//
// A block per (32 value dims, value head h, sequence b), 4 warps. The fp32 state slice [Dk, 32] lives in the mma
// accumulators of its update (warp w holds key-dim tiles w and w + 4) and as a bf16 copy in shared memory, the B
// operand of the products that read it. Products are bf16 mma.sync with fp32 accumulation; q and k enter them raw
// (exact) with their norms applied in fp32 to the results; T is computed in fp32 (16 x 16 diagonal blocks by
// forward substitution, the blocks below them by distance from the diagonal), then rounded into the bf16
// operands of W and U. Sequences with fewer than `chunk_from` tokens are left to the recurrent kernels: decode
// and short verify steps keep their bits, and a prompt's bits depend on how its prefill is cut into calls, so
// the engine's batch-invariant mode does not use these kernels.
//
// q, k [T, Hk, Dk] and v [T, Hv, Dv] strided (s0 token, s1 head; dims contiguous, 16-byte aligned rows), the
// gates as GdnGates / SsdGates read them (recurrent_gates.cuh), state [S, Hv, Dk, Dv] fp32 ([S, Hm, P, N] for
// Mamba-2: read and written transposed), out [T, Hv, Dv]; Dk = 16 KT, Dv a multiple of 8.
#include "mma_frags.cuh"
#include "recurrent_gates.cuh"

#define GDC_CHUNK 64      // tokens per chunk
#define GDC_THREADS 128   // 4 warps: warp w owns rows 16 w .. 16 w + 15 of every chunk-sized product
#define GDC_COLS 32       // value dims per block
#define GDC_VSTR 40       // padded bf16 row of a 32-wide tile (conflict-free ldmatrix)
#define GDC_TSTR 72       // padded row of a 64-wide tile
#define GDC_L2_EPS 1e-6f  // as recurrent.cu's GDN_L2_EPS

template <int KT>
struct ChunkTiles {
    static constexpr int DK = 16 * KT, KSTR = DK + 8;
    bf16_t k[GDC_CHUNK * KSTR];        // the chunk's raw keys
    bf16_t q[GDC_CHUNK * KSTR];        // and queries
    float a[GDC_CHUNK * GDC_TSTR];     // A; then the bf16 operands Tw = T diag(beta exp(G) kn), Tu = T diag(beta)
    float t[GDC_CHUNK * GDC_TSTR];     // T; then delta' = exp(G_L - G) kn delta (bf16), the state update's operand
    float x[3 * 256];                  // sums of the blocks of T below the diagonal
    bf16_t p[GDC_CHUNK * GDC_TSTR];    // exp(G_t - G_s) (q^_t . k^_s), s <= t
    bf16_t v[GDC_CHUNK * GDC_VSTR];    // the block's 32 value dims; then delta
    bf16_t s[DK * GDC_VSTR];           // the state entering the chunk, bf16
    float gc[GDC_CHUNK], beta[GDC_CHUNK], qn[GDC_CHUNK], kn[GDC_CHUNK], wk[GDC_CHUNK];
};

// Rows t0 = 16 w + lane / 4 and t0 + 8 of a [64, 32] accumulator as bf16 pairs into a tile of GDC_VSTR rows, each
// row scaled by f0 / f1.
__device__ __forceinline__ void store_pairs(bf16_t* tile, const float (&acc)[4][4], int t0, int qd, float f0, float f1) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
        const int col = nt * 8 + 2 * qd;
        *reinterpret_cast<unsigned*>(tile + t0 * GDC_VSTR + col) = pack_bf16(acc[nt][0] * f0, acc[nt][1] * f0);
        *reinterpret_cast<unsigned*>(tile + (t0 + 8) * GDC_VSTR + col) = pack_bf16(acc[nt][2] * f1, acc[nt][3] * f1);
    }
}

// The blocks of T at distance D below the diagonal, T_ij = -T_ii sum_{m=j}^{i-1} A_im T_mj (j = i - D), from the
// blocks nearer the diagonal: each thread takes ENTRIES entries at once (independent sums, in the same order each).
template <int KT, int D>
__device__ __forceinline__ void inverse_level(ChunkTiles<KT>& sh, int tid) {
    constexpr int ENTRIES = (4 - D) * 256 / GDC_THREADS;
    float acc[ENTRIES];
#pragma unroll
    for (int n = 0; n < ENTRIES; ++n) acc[n] = 0.0f;
#pragma unroll
    for (int mm = 0; mm < D; ++mm)
#pragma unroll
        for (int u = 0; u < 16; ++u)
#pragma unroll
            for (int n = 0; n < ENTRIES; ++n) {
                const int e = tid + n * GDC_THREADS, j = e >> 8, r = (e >> 4) & 15, c = e & 15;
                acc[n] = __fmaf_rn(sh.a[(16 * (j + D) + r) * GDC_TSTR + 16 * (j + mm) + u],
                                   sh.t[(16 * (j + mm) + u) * GDC_TSTR + 16 * j + c], acc[n]);
            }
#pragma unroll
    for (int n = 0; n < ENTRIES; ++n) sh.x[tid + n * GDC_THREADS] = acc[n];
    __syncthreads();
#pragma unroll
    for (int n = 0; n < ENTRIES; ++n) acc[n] = 0.0f;
#pragma unroll
    for (int u = 0; u < 16; ++u)
#pragma unroll
        for (int n = 0; n < ENTRIES; ++n) {
            const int e = tid + n * GDC_THREADS, j = e >> 8, r = (e >> 4) & 15, c = e & 15;
            acc[n] = __fmaf_rn(sh.t[(16 * (j + D) + r) * GDC_TSTR + 16 * (j + D) + u], sh.x[(j << 8) + u * 16 + c], acc[n]);
        }
#pragma unroll
    for (int n = 0; n < ENTRIES; ++n) {
        const int e = tid + n * GDC_THREADS, j = e >> 8, r = (e >> 4) & 15, c = e & 15;
        sh.t[(16 * (j + D) + r) * GDC_TSTR + 16 * j + c] = -acc[n];
    }
    __syncthreads();
}

// T = (I + A)^-1 for the strictly lower A in sh.a: the 4 diagonal 16 x 16 blocks by forward substitution (a warp
// each, a lane per column, each row's sum in two halves), then the blocks below them by distance (inverse_level).
template <int KT>
__device__ __forceinline__ void invert_unit_lower(ChunkTiles<KT>& sh, int tid, int lane, int warp) {
    if (lane < 16) {
        const int b0 = 16 * warp;
        float x[16];
#pragma unroll
        for (int r = 0; r < 16; ++r) {
            float even = r == lane ? 1.0f : 0.0f, odd = 0.0f;
#pragma unroll
            for (int c = 0; c < r; ++c) {
                const float term = -sh.a[(b0 + r) * GDC_TSTR + b0 + c];
                if (c & 1) odd = __fmaf_rn(term, x[c], odd);
                else even = __fmaf_rn(term, x[c], even);
            }
            x[r] = even + odd;
        }
#pragma unroll
        for (int r = 0; r < 16; ++r) sh.t[(b0 + r) * GDC_TSTR + b0 + lane] = x[r];
    }
    __syncthreads();
    inverse_level<KT, 1>(sh, tid);
    inverse_level<KT, 2>(sh, tid);
    inverse_level<KT, 3>(sh, tid);
}

// The delta rule's correction of a chunk: T from A (in sh.a), then u = U - W S over this warp's rows, with
// U = T diag(beta) v and W = T diag(beta exp(G) kn) k (kept in registers as the A fragments of W S).
template <int KT>
__device__ __forceinline__ void delta_rule_update(ChunkTiles<KT>& sh, float (&u)[4][4], int tid, int lane, int warp) {
    constexpr int KSTR = ChunkTiles<KT>::KSTR;
    invert_unit_lower(sh, tid, lane, warp);
    // the operands of W and U: T's columns scaled, rounded to bf16 (over A, which is no longer read)
    bf16_t* tw = reinterpret_cast<bf16_t*>(sh.a);
    bf16_t* tu = tw + GDC_CHUNK * GDC_TSTR;
#pragma unroll 4
    for (int e = tid; e < GDC_CHUNK * GDC_CHUNK; e += GDC_THREADS) {
        const int t = e >> 6, s = e & 63;
        const float tv = s <= t ? sh.t[t * GDC_TSTR + s] : 0.0f;
        tw[t * GDC_TSTR + s] = float_to_bf16(tv * sh.wk[s]);
        tu[t * GDC_TSTR + s] = float_to_bf16(tv * sh.beta[s]);
    }
    __syncthreads();
    float w[2 * KT][4], ws[4][4];
#pragma unroll
    for (int nt = 0; nt < 2 * KT; ++nt) w[nt][0] = w[nt][1] = w[nt][2] = w[nt][3] = 0.0f;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) ws[nt][0] = ws[nt][1] = ws[nt][2] = ws[nt][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < GDC_CHUNK / 16; ++ks) {
        unsigned at[4], au[4];
        load_rows_a(at, tw, GDC_TSTR, warp * 16, ks, lane);
        load_rows_a(au, tu, GDC_TSTR, warp * 16, ks, lane);
        mma_rows<KT>(w, at, sh.k, KSTR, ks, lane);
        mma_rows<2>(u, au, sh.v, GDC_VSTR, ks, lane);
    }
#pragma unroll
    for (int ks = 0; ks < KT; ++ks) {
        const unsigned aw[4] = {pack_bf16(w[2 * ks][0], w[2 * ks][1]), pack_bf16(w[2 * ks][2], w[2 * ks][3]),
                                pack_bf16(w[2 * ks + 1][0], w[2 * ks + 1][1]), pack_bf16(w[2 * ks + 1][2], w[2 * ks + 1][3])};
        mma_rows<2>(ws, aw, sh.s, GDC_VSTR, ks, lane);
    }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) u[nt][e] -= ws[nt][e];
}

// A lane's entries of the state slice [Dk, 32] at value dim col0 (key-dim tiles warp and warp + 4, 4 n-tiles of 8
// value dims, as mma accumulators), loaded from (LOAD; zeros outside Dk x Dv and for no row) or stored to a state
// row of [Dk, Dv] (the delta rule), or of [Dv, Dk] when TRANSPOSED (Mamba-2's [P, N]).
template <bool LOAD, bool TRANSPOSED, int KT>
__device__ __forceinline__ void state_slice(float (&S)[2][4][4], float* rows, int col0, int dv, int warp, int lane) {
    constexpr int DK = 16 * KT;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = (warp + 4 * mi) * 16 + (lane >> 2) + 8 * (e >> 1);
                const int j = col0 + nt * 8 + 2 * (lane & 3) + (e & 1);
                const bool inside = warp + 4 * mi < KT && j < dv;
                const long long at = TRANSPOSED ? (long long)j * DK + i : (long long)i * dv + j;
                if (LOAD) S[mi][nt][e] = rows && inside ? rows[at] : 0.0f;
                else if (inside) rows[at] = S[mi][nt][e];
            }
}

// DELTA: the gated delta rule; otherwise Mamba-2's scan (see the header), with `skip` its D [Hv].
template <int KT, bool DELTA, class Gates>
__device__ __forceinline__ void chunked_scan(
    const bf16_t* __restrict__ q, long long q_s0, long long q_s1, const bf16_t* __restrict__ k, long long k_s0,
    long long k_s1, const bf16_t* __restrict__ v, long long v_s0, long long v_s1, const Gates& gates,
    const float* __restrict__ skip, float* __restrict__ state, const int* __restrict__ starts,
    const int* __restrict__ slots, bf16_t* __restrict__ out, int key_heads, int value_heads, int dv, float scale,
    int l2norm, int chunk_from) {
    constexpr int DK = 16 * KT, KSTR = DK + 8, VEC = DK / 8;
    extern __shared__ __align__(16) unsigned char chunk_tiles_raw[];
    ChunkTiles<KT>& sh = *reinterpret_cast<ChunkTiles<KT>*>(chunk_tiles_raw);
    if (dynamic_shared_bytes() < sizeof(ChunkTiles<KT>)) __trap();  // the host sized the tiles wrongly
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, qd = lane & 3;
    const int col0 = blockIdx.x * GDC_COLS, h = blockIdx.y, kh = h / (value_heads / key_heads);
    const int r0 = starts[blockIdx.z], r1 = starts[blockIdx.z + 1];
    if (r1 - r0 < chunk_from || r1 <= r0) return;
    const long long slot = slots[blockIdx.z];
    float* rows = slot >= 0 ? state + (slot * value_heads + h) * (long long)DK * dv : nullptr;
    const int t0 = warp * 16 + (lane >> 2);  // this lane's accumulator rows t0 and t0 + 8 of chunk-sized products

    // the state slice: key-dim tiles warp and warp + 4, 4 n-tiles of 8 value dims
    float S[2][4][4];
    state_slice<true, !DELTA, KT>(S, rows, col0, dv, warp, lane);
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
        if (warp + 4 * mi < KT) store_pairs(sh.s + (warp + 4 * mi) * 16 * GDC_VSTR, S[mi], lane >> 2, qd, 1.0f, 1.0f);

    for (long long c0 = r0; c0 < r1; c0 += GDC_CHUNK) {
        const int n = (int)min((long long)GDC_CHUNK, r1 - c0);
        // ---- the chunk's inputs (zeros past its end: they add nothing to any product)
        for (int e = tid; e < GDC_CHUNK * VEC; e += GDC_THREADS) {
            const int t = e / VEC, c = (e % VEC) * 8;
            uint4 qv = make_uint4(0, 0, 0, 0), kv = qv;
            if (t < n) {
                qv = *reinterpret_cast<const uint4*>(q + (c0 + t) * q_s0 + kh * q_s1 + c);
                kv = *reinterpret_cast<const uint4*>(k + (c0 + t) * k_s0 + kh * k_s1 + c);
            }
            *reinterpret_cast<uint4*>(sh.q + t * KSTR + c) = qv;
            *reinterpret_cast<uint4*>(sh.k + t * KSTR + c) = kv;
        }
        for (int e = tid; e < GDC_CHUNK * 4; e += GDC_THREADS) {
            const int t = e >> 2, c = (e & 3) * 8;
            uint4 vv = make_uint4(0, 0, 0, 0);
            if (t < n && col0 + c < dv) vv = *reinterpret_cast<const uint4*>(v + (c0 + t) * v_s0 + h * v_s1 + col0 + c);
            *reinterpret_cast<uint4*>(sh.v + t * GDC_VSTR + c) = vv;
        }
        if (tid < GDC_CHUNK) {
            sh.gc[tid] = tid < n ? gates.decay(c0 + tid, h, value_heads) : 0.0f;
            sh.beta[tid] = tid < n ? gates.strength(c0 + tid, h, value_heads) : 0.0f;
        }
        __syncthreads();
        // ---- norms (a warp per token, 4 tokens in flight) and the cumulative decay G (warp 0, a scan of pairs)
#pragma unroll 4
        for (int t = warp; t < GDC_CHUNK; t += 4) {
            float qq = 0.0f, kk = 0.0f;
            for (int i = lane; i < DK; i += 32) {
                const float a = bf16_to_float(sh.q[t * KSTR + i]), c = bf16_to_float(sh.k[t * KSTR + i]);
                qq = __fmaf_rn(a, a, qq);
                kk = __fmaf_rn(c, c, kk);
            }
            qq = warp_sum(qq);
            kk = warp_sum(kk);
            if (lane == 0) {
                sh.qn[t] = l2norm ? scale / sqrtf(__fadd_rn(qq, GDC_L2_EPS)) : scale;
                sh.kn[t] = l2norm ? 1.0f / sqrtf(__fadd_rn(kk, GDC_L2_EPS)) : 1.0f;
            }
        }
        if (warp == 0) {
            const float ga = sh.gc[2 * lane], gb = sh.gc[2 * lane + 1];
            float inclusive = ga + gb;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float y = __shfl_up_sync(0xffffffffu, inclusive, o);
                if (lane >= o) inclusive += y;
            }
            float before = __shfl_up_sync(0xffffffffu, inclusive, 1);
            if (lane == 0) before = 0.0f;
            sh.gc[2 * lane] = before + ga;
            sh.gc[2 * lane + 1] = inclusive;
        }
        __syncthreads();
        if (tid < GDC_CHUNK) sh.wk[tid] = sh.beta[tid] * expf(sh.gc[tid]) * sh.kn[tid];

        // ---- q k^T (and k k^T for the delta rule) over the chunk: rows t0, t0 + 8 of this warp, 64 columns
        float kk[8][4], qk[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) kk[nt][e] = qk[nt][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KT; ++ks) {
            unsigned ak[4], aq[4];
            if constexpr (DELTA) load_rows_a(ak, sh.k, KSTR, warp * 16, ks, lane);
            load_rows_a(aq, sh.q, KSTR, warp * 16, ks, lane);
#pragma unroll
            for (int nn = 0; nn < 4; ++nn) {
                unsigned kb[4];
                ldmatrix_x4(kb, sh.k + (nn * 16 + (lane & 7) + ((lane >> 4) << 3)) * KSTR + ks * 16 + ((lane >> 3) & 1) * 8);
                if constexpr (DELTA) {
                    mma_16816(kk[2 * nn], ak[0], ak[1], ak[2], ak[3], kb[0], kb[1]);
                    mma_16816(kk[2 * nn + 1], ak[0], ak[1], ak[2], ak[3], kb[2], kb[3]);
                }
                mma_16816(qk[2 * nn], aq[0], aq[1], aq[2], aq[3], kb[0], kb[1]);
                mma_16816(qk[2 * nn + 1], aq[0], aq[1], aq[2], aq[3], kb[2], kb[3]);
            }
        }
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int t = t0 + 8 * (e >> 1), s = nt * 8 + 2 * qd + (e & 1);
                const float decay = s <= t ? expf(sh.gc[t] - sh.gc[s]) : 0.0f;
                if constexpr (DELTA)
                    sh.a[t * GDC_TSTR + s] = s < t ? sh.beta[t] * sh.kn[t] * sh.kn[s] * decay * kk[nt][e] : 0.0f;
                sh.p[t * GDC_TSTR + s] = float_to_bf16(sh.qn[t] * sh.kn[s] * decay * qk[nt][e]);
            }
        __syncthreads();

        // ---- delta: U - W S for the delta rule, beta v for Mamba-2; q S from the state's bf16 copy
        float u[4][4], qs[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int t = t0 + 8 * (e >> 1), col = nt * 8 + 2 * qd + (e & 1);
                u[nt][e] = DELTA ? 0.0f : sh.beta[t] * bf16_to_float(sh.v[t * GDC_VSTR + col]);
                qs[nt][e] = 0.0f;
            }
        if constexpr (DELTA) delta_rule_update<KT>(sh, u, tid, lane, warp);
#pragma unroll
        for (int ks = 0; ks < KT; ++ks) {
            unsigned aq[4];
            load_rows_a(aq, sh.q, KSTR, warp * 16, ks, lane);
            mma_rows<2>(qs, aq, sh.s, GDC_VSTR, ks, lane);
        }
        const float last = sh.gc[GDC_CHUNK - 1];  // G_L: padding rows have g = 0
        const float oq0 = expf(sh.gc[t0]) * sh.qn[t0], oq1 = expf(sh.gc[t0 + 8]) * sh.qn[t0 + 8];
        const float dk0 = expf(last - sh.gc[t0]) * sh.kn[t0], dk1 = expf(last - sh.gc[t0 + 8]) * sh.kn[t0 + 8];
        const float d_skip = skip ? skip[h] : 0.0f;
        float o[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int t = t0 + 8 * (e >> 1), col = nt * 8 + 2 * qd + (e & 1);
                o[nt][e] = __fmaf_rn(d_skip, bf16_to_float(sh.v[t * GDC_VSTR + col]), (e < 2 ? oq0 : oq1) * qs[nt][e]);
            }
        __syncthreads();  // v, T and the state's bf16 copy are read: delta and delta' take their place
        bf16_t* delta = sh.v;
        bf16_t* delta_k = reinterpret_cast<bf16_t*>(sh.t);
        store_pairs(delta, u, t0, qd, 1.0f, 1.0f);
        store_pairs(delta_k, u, t0, qd, dk0, dk1);
        __syncthreads();

        // ---- o += P delta; the rows of real tokens go out
#pragma unroll
        for (int ks = 0; ks < GDC_CHUNK / 16; ++ks) {
            unsigned ap[4];
            load_rows_a(ap, sh.p, GDC_TSTR, warp * 16, ks, lane);
            mma_rows<2>(o, ap, delta, GDC_VSTR, ks, lane);
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int t = t0 + 8 * half;
            if (t >= n) continue;
            bf16_t* dst = out + ((c0 + t) * value_heads + h) * dv + col0;
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const int col = nt * 8 + 2 * qd;
                if (col0 + col < dv)
                    *reinterpret_cast<unsigned*>(dst + col) = pack_bf16(o[nt][2 * half], o[nt][2 * half + 1]);
            }
        }
        // ---- S = exp(G_L) S + k^T delta' (k^T: A fragments of the key tile, transposed by ldmatrix)
        const float decay_last = expf(last);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
            const int mt = warp + 4 * mi;
            if (mt >= KT) continue;
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) S[mi][nt][e] *= decay_last;
#pragma unroll
            for (int ks = 0; ks < GDC_CHUNK / 16; ++ks) {
                unsigned ak[4];
                ldmatrix_x4_trans(ak, sh.k + (ks * 16 + (lane & 7) + ((lane >> 4) << 3)) * KSTR + mt * 16 + ((lane >> 3) & 1) * 8);
                mma_rows<2>(S[mi], ak, delta_k, GDC_VSTR, ks, lane);
            }
            store_pairs(sh.s + mt * 16 * GDC_VSTR, S[mi], lane >> 2, qd, 1.0f, 1.0f);
        }
        __syncthreads();  // the next chunk's inputs overwrite k, q and v
    }
    if (rows) state_slice<false, !DELTA, KT>(S, rows, col0, dv, warp, lane);
}

// Grid (ceil(Dv / 32), Hv, B), GDC_THREADS threads, sizeof(ChunkTiles<KT>) bytes of dynamic shared memory.
#define GATED_DELTA_CHUNKED(KT)                                                                                       \
    extern "C" __global__ void __launch_bounds__(GDC_THREADS) gated_delta_chunked_k##KT##_bf16(                       \
        const bf16_t* __restrict__ q, long long q_s0, long long q_s1, const bf16_t* __restrict__ k, long long k_s0,   \
        long long k_s1, const bf16_t* __restrict__ v, long long v_s0, long long v_s1, GDN_GATE_PARAMS,                \
        float* __restrict__ state, const int* __restrict__ starts, const int* __restrict__ slots,                     \
        bf16_t* __restrict__ out, int key_heads, int value_heads, int dv, float scale, int l2norm, int chunk_from) {  \
        await_inputs();                                                                                               \
        chunked_scan<KT, true>(q, q_s0, q_s1, k, k_s0, k_s1, v, v_s0, v_s1, GDN_GATES, nullptr, state, starts,       \
                               slots, out, key_heads, value_heads, dv, scale, l2norm, chunk_from);                   \
    }
GATED_DELTA_CHUNKED(1)
GATED_DELTA_CHUNKED(2)
GATED_DELTA_CHUNKED(4)
GATED_DELTA_CHUNKED(8)

// Mamba-2: x [T, Hm, P] (strides x_s0, x_s1), dt [T, Hm] (row stride dt_s0), B / C [T, G, N] (strides s0, s1),
// A / D / dt_bias [Hm] fp32, state [S, Hm, P, N] fp32, out [T, Hm, P]; N = 16 KT. Grid (ceil(P / 32), Hm, B).
#define MAMBA2_CHUNKED(KT)                                                                                            \
    extern "C" __global__ void __launch_bounds__(GDC_THREADS) mamba2_chunked_k##KT##_bf16(                            \
        MAMBA2_SCAN_PARAMS) {                                                                                         \
        await_inputs();                                                                                               \
        chunked_scan<KT, false>(C, c_s0, c_s1, B, b_s0, b_s1, x, x_s0, x_s1, SsdGates{dt, dt_s0, A, dt_bias, dt_min,  \
                                dt_max}, D, state, starts, slots, out, groups, heads, head_dim, 1.0f, 0, chunk_from); \
    }
MAMBA2_CHUNKED(1)
MAMBA2_CHUNKED(2)
MAMBA2_CHUNKED(4)
MAMBA2_CHUNKED(8)

// The bytes of dynamic shared memory each kernel above takes, by KT (read by the host from the compiled module).
extern "C" __device__ int chunked_scan_shared_bytes[4] = {
    (int)sizeof(ChunkTiles<1>), (int)sizeof(ChunkTiles<2>), (int)sizeof(ChunkTiles<4>), (int)sizeof(ChunkTiles<8>)};
