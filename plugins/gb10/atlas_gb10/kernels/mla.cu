// Multi-head latent attention (MLA) ops of the `mla` group: per-head products, the latent KV write, and
// attention over the paged latent cache in the absorbed form (one key/value head shared by every query
// head: key = the whole cache row [latent | rope], value = its latent part).
//
// Batch invariance as in attention.cu: a row's arithmetic never depends on the other rows of its block,
// the tile shape, or the batch. Keys are processed in tiles of MLA_TILE_N aligned to key 0, grouped in
// splits of MLA_SPLIT keys; each split is an online softmax over its tiles in order, and splits are
// merged in order (`splits.cuh`), inside the block (direct mode) or by `mla_combine` from a workspace.
// The tensor-core products (mma.sync m16n8k16, fp32 accumulation) compute each output element from its
// own row and column only, in a k order fixed by the widths.
#include "gemm_core.cuh"
#include "splits.cuh"

#ifndef MLA_TILE_N
#define MLA_TILE_N 64
#endif
#ifndef MLA_SPLIT
#define MLA_SPLIT 256
#endif
#define MLA_NPW (MLA_TILE_N / 32)  // score n-tiles (8 keys each) per warp: 4 warps cover a tile's keys

// ---- per-head products ----------------------------------------------------------------------------
// out[t, h, n] = sum_k x[t, h, k] * w[h, n, k]. One warp computes an (MT x 16) x (NT x 8) tile of one head
// over the whole of K (`mma_chunks`: 32-wide chunks in order, fragments straight from global memory), so a
// row's result depends only on its x row, w and K. Block: 4 warps side by side along N; grid
// (ceil(N / (32 NT)), ceil(T / (16 MT)), H).
template <int MT, int NT, int U, bool VEC>
__device__ __forceinline__ void head_linear_tile(const bf16_t* __restrict__ x, long long ldx, const bf16_t* __restrict__ w,
                                                 bf16_t* __restrict__ out, long long ldo, int m0, int M, int n0, int N,
                                                 int K) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    float acc[MT][NT][4] = {};
    mma_chunks<MT, NT, U, VEC>(x, ldx, nullptr, w, m0, M, n0, N, K, 0, (K + 31) / 32, acc);
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = m0 + i * 16 + g + ((e & 2) ? 8 : 0);
                const int col = n0 + j * 8 + 2 * q + (e & 1);
                if (row < M && col < N) out[(long long)row * ldo + col] = float_to_bf16(acc[i][j][e]);
            }
}

#define HEAD_LINEAR_KERNEL(MT, NT, U, VEC, SUFFIX)                                                                   \
    extern "C" __global__ void __launch_bounds__(128) mla_head_linear_m##MT##_n##NT##_##SUFFIX(                     \
        const bf16_t* __restrict__ x, long long x_s0, long long x_s1, const bf16_t* __restrict__ w,                  \
        bf16_t* __restrict__ out, long long o_s0, long long o_s1, int M, int N, int K) { await_inputs();            \
        const long long h = blockIdx.z;                                                                              \
        head_linear_tile<MT, NT, U, VEC>(x + h * x_s1, x_s0, w + h * N * K, out + h * o_s1, o_s0,                   \
                                         blockIdx.y * (MT * 16), M, (blockIdx.x * 4 + (threadIdx.x >> 5)) * (NT * 8), \
                                         N, K);                                                                      \
    }

// Decode-sized (one m-tile, narrow warps: many warps streaming the weights) and prefill-sized tiles.
HEAD_LINEAR_KERNEL(1, 1, 4, true, vec)
HEAD_LINEAR_KERNEL(1, 1, 4, false, any)
HEAD_LINEAR_KERNEL(2, 4, 2, true, vec)
HEAD_LINEAR_KERNEL(2, 4, 2, false, any)

// ---- the latent KV write --------------------------------------------------------------------------
// cache [blocks, block_size, 1, L + R]: the row of flat slot s = slots[t] becomes [latent[t] | rope[t]]
// (element strides: token s0, feature s1); slot -1 skips the token. One block per token.
extern "C" __global__ void mla_write_latent_bf16(bf16_t* __restrict__ cache, const bf16_t* __restrict__ latent,
                                                 long long l_s0, long long l_s1, const bf16_t* __restrict__ rope,
                                                 long long r_s0, long long r_s1, const int* __restrict__ slots, int L,
                                                 int R) {
    await_inputs();
    const long long t = blockIdx.x;
    const long long slot = slots[t];
    if (slot < 0) return;
    const int W = L + R;
    bf16_t* dst = cache + slot * W;
    for (int i = threadIdx.x; i < W; i += blockDim.x)
        dst[i] = i < L ? latent[t * l_s0 + i * l_s1] : rope[t * r_s0 + (long long)(i - L) * r_s1];
}

// ---- attention over the latent cache --------------------------------------------------------------
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// ldmatrix: lanes 0-7, 8-15 (, 16-23, 24-31) give the row addresses of 8x8 matrices 0, 1 (, 2, 3); lane
// l receives row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of each (of each transposed matrix: .trans).
__device__ __forceinline__ void ldsm_x4(const bf16_t* p, unsigned* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldsm_x2(const bf16_t* p, unsigned* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldsm_x2_trans(const bf16_t* p, unsigned* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr(p)));
}

// Start copying the cache rows of one tile of keys into shared memory (rows of `stride` elements; the
// first W8 = W rounded up to 8 are written, 16-byte asynchronous copies when W % 8 == 0; keys without a
// slot and elements past W become zeros).
__device__ __forceinline__ void load_latent_tile(bf16_t* dst, const long long* slots, const bf16_t* __restrict__ cache,
                                                 int W, int stride, int tid, int threads) {
    const int chunks = (W + 7) / 8;
    for (int i = tid; i < MLA_TILE_N * chunks; i += threads) {
        const int c = i / chunks, j = (i - c * chunks) * 8;
        const long long slot = slots[c];
        bf16_t* d = dst + c * stride + j;
        if (slot >= 0 && (W & 7) == 0) {
            cp_async16(d, cache + slot * W + j);
            continue;
        }
        unsigned v[4] = {0u, 0u, 0u, 0u};
        if (slot >= 0) {
            const bf16_t* src = cache + slot * W + j;
#pragma unroll
            for (int e = 0; e < 4; ++e)
                v[e] = (j + 2 * e < W ? (unsigned)src[2 * e] : 0u) | ((j + 2 * e + 1 < W ? (unsigned)src[2 * e + 1] : 0u) << 16);
        }
        const uint4 z = {v[0], v[1], v[2], v[3]};
        *reinterpret_cast<uint4*>(d) = z;
    }
}

// One block: work item (sequence b, first query token, split or -1) x head tile blockIdx.y, TM = 16 MT
// rows = (query token, head) pairs: row r is token tile_tok + r / hpt, head blockIdx.y * hpt + r % hpt.
// 4 MT warps; warp w owns m-tile w / 4 and quarter w % 4: keys [quarter * 8 NPW, +8 NPW) of each tile
// for the scores, output columns [quarter * 8 NW, +8 NW) of the latent for P V (so 32 NW >= L).
//
// Shared memory (bytes, matching `mla_shared_bytes` in mla.py): kslot[MLA_SPLIT] (8 each), Q [TM][stride],
// `buffers` key tiles [MLA_TILE_N][stride] (bf16, stride = W rounded up to 16, plus 8), P [TM][TILE_N + 8]
// bf16, S [TM][TILE_N + 1] float, then ten per-row arrays of TM 4-byte values.
template <int MT, int NW>
__device__ __forceinline__ void mla_attention_body(
    const bf16_t* __restrict__ q_lat, long long ql_s0, long long ql_s1, const bf16_t* __restrict__ q_rope,
    long long qr_s0, long long qr_s1, const bf16_t* __restrict__ cache, const int* __restrict__ query_start,
    const int* __restrict__ seq_lens, const int* __restrict__ block_tables, int table_width,
    const int4* __restrict__ work, bf16_t* __restrict__ out, long long o_s0, long long o_s1,
    float* __restrict__ ws_acc, float2* __restrict__ ws_ml, int splits, int heads, int hpt, int L, int R,
    int block_size, float scale, const float* __restrict__ row_scale, int buffers) {
    constexpr int TM = 16 * MT, THREADS = 128 * MT, PSTR = MLA_TILE_N + 8, SSTR = MLA_TILE_N + 1;
    extern __shared__ __align__(16) unsigned char smem[];
    const int W = L + R, W_pad = (W + 15) & ~15, W8 = (W + 7) & ~7, stride = W_pad + 8;
    long long* kslot = reinterpret_cast<long long*>(smem);
    bf16_t* Qs = reinterpret_cast<bf16_t*>(kslot + MLA_SPLIT);
    bf16_t* KV = Qs + TM * stride;
    bf16_t* Ps = KV + buffers * MLA_TILE_N * stride;
    float* Ss = reinterpret_cast<float*>(Ps + TM * PSTR);
    int* qpos = reinterpret_cast<int*>(Ss + TM * SSTR);
    float* rowf = reinterpret_cast<float*>(qpos + TM);
    float* m_split = rowf + TM;
    float* l_split = m_split + TM;
    float* alpha = l_split + TM;
    float* M_tot = alpha + TM;
    float* L_tot = M_tot + TM;
    float* fa = L_tot + TM;
    float* fb = fa + TM;
    int* take = reinterpret_cast<int*>(fb + TM);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int mi = warp >> 2, wq = warp & 3;
    const int4 item = work[blockIdx.x];
    const int b = item.x, tile_tok = item.y, only_split = item.z;
    const int h0 = blockIdx.y * hpt;
    const int q_begin = query_start[b], q_len = query_start[b + 1] - q_begin, ctx = seq_lens[b];
    const int tokens = min(TM / hpt, q_len - tile_tok);
    if (tokens <= 0) return;
    const int first_pos = ctx - q_len + tile_tok;
    const int key_end = first_pos + tokens;  // keys [0, key_end) are visible to some row of the block
    const int* table = block_tables + (long long)b * table_width;

    // rows: position (-1: no row), score factor, running statistics; Q rows [latent | rope | zeros]
    for (int r = tid; r < TM; r += THREADS) {
        const int tok = r / hpt, h = h0 + r % hpt;
        const bool valid = tok < tokens && h < heads;
        qpos[r] = valid ? first_pos + tok : -1;
        rowf[r] = row_scale != nullptr && valid ? __fmul_rn(scale, row_scale[q_begin + tile_tok + tok]) : scale;
        M_tot[r] = NEG_INF;
        L_tot[r] = 0.0f;
    }
    for (int i = tid; i < TM * W_pad; i += THREADS) {
        const int r = i / W_pad, c = i - r * W_pad;
        const int tok = r / hpt, h = h0 + r % hpt;
        bf16_t v = 0;
        if (tok < tokens && h < heads && c < W) {
            const long long t = q_begin + tile_tok + tok;
            v = c < L ? q_lat[t * ql_s0 + h * ql_s1 + c] : q_rope[t * qr_s0 + h * qr_s1 + (c - L)];
        }
        Qs[r * stride + c] = v;
    }
    for (int i = tid; i < buffers * MLA_TILE_N * (W_pad - W8); i += THREADS) {  // pad columns, never loaded
        const int row = i / (W_pad - W8);
        KV[row * stride + W8 + (i - row * (W_pad - W8))] = 0;
    }

    int s_lo, s_hi;
    if (only_split >= 0) {
        s_lo = s_hi = only_split;
    } else {
        s_lo = 0;
        s_hi = key_end > 0 ? (key_end - 1) / MLA_SPLIT : -1;
    }
    const int r0 = mi * 16 + g, r1 = r0 + 8;  // the two rows of this lane's accumulator fragments
    float O[NW][4];
#pragma unroll
    for (int i = 0; i < NW; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) O[i][e] = 0.0f;

    for (int s = s_lo; s <= s_hi; ++s) {
        __syncthreads();  // the previous split's merge has read its statistics; kslot and tiles are free
        float acc[NW][4];
#pragma unroll
        for (int i = 0; i < NW; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;
        for (int r = tid; r < TM; r += THREADS) {
            m_split[r] = NEG_INF;
            l_split[r] = 0.0f;
        }
        const int tile_lo = s * MLA_SPLIT;
        const int tile_hi = min((s + 1) * MLA_SPLIT, key_end);
        const int tiles = tile_hi > tile_lo ? (tile_hi - tile_lo + MLA_TILE_N - 1) / MLA_TILE_N : 0;
        for (int c = tid; c < tiles * MLA_TILE_N; c += THREADS) {
            const int kpos = tile_lo + c;
            kslot[c] = kpos < key_end ? (long long)table[kpos / block_size] * block_size + kpos % block_size : -1;
        }
        __syncthreads();
        if (tiles > 0) load_latent_tile(KV, kslot, cache, W, stride, tid, THREADS);
        cp_async_commit();
        for (int it = 0; it < tiles; ++it) {
            const int t0 = tile_lo + it * MLA_TILE_N;
            const bf16_t* Kb = KV + (buffers == 2 ? (it & 1) : 0) * MLA_TILE_N * stride;
            if (buffers == 2 && it + 1 < tiles) {  // the next tile streams in while this one is computed
                load_latent_tile(KV + ((it + 1) & 1) * MLA_TILE_N * stride, kslot + (it + 1) * MLA_TILE_N, cache, W,
                                 stride, tid, THREADS);
                cp_async_commit();
                cp_async_wait_one();
            } else {
                cp_async_wait_all();
            }
            __syncthreads();
            // ---- scores S = Q K^T over the W_pad dims in order, scaled per row, masked causally
            {
                float sc[MLA_NPW][4];
#pragma unroll
                for (int j = 0; j < MLA_NPW; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) sc[j][e] = 0.0f;
                const bf16_t* qa = Qs + (mi * 16 + (lane & 15)) * stride + (lane >> 4) * 8;
                const bf16_t* kb = Kb + (wq * MLA_NPW * 8 + (lane & 7)) * stride + ((lane >> 3) & 1) * 8;
#pragma unroll 2
                for (int k0 = 0; k0 < W_pad; k0 += 16) {
                    unsigned a[4];
                    ldsm_x4(qa + k0, a);
#pragma unroll
                    for (int j = 0; j < MLA_NPW; ++j) {
                        unsigned bb[2];
                        ldsm_x2(kb + j * 8 * stride + k0, bb);
                        mma_16816(sc[j], a[0], a[1], a[2], a[3], bb[0], bb[1]);
                    }
                }
                const int p0 = qpos[r0], p1 = qpos[r1];
                const float f0 = rowf[r0], f1 = rowf[r1];
#pragma unroll
                for (int j = 0; j < MLA_NPW; ++j) {
                    const int c = (wq * MLA_NPW + j) * 8 + 2 * tq;
                    const int kpos = t0 + c;
                    Ss[r0 * SSTR + c] = kpos <= p0 ? __fmul_rn(sc[j][0], f0) : NEG_INF;
                    Ss[r0 * SSTR + c + 1] = kpos + 1 <= p0 ? __fmul_rn(sc[j][1], f0) : NEG_INF;
                    Ss[r1 * SSTR + c] = kpos <= p1 ? __fmul_rn(sc[j][2], f1) : NEG_INF;
                    Ss[r1 * SSTR + c + 1] = kpos + 1 <= p1 ? __fmul_rn(sc[j][3], f1) : NEG_INF;
                }
            }
            __syncthreads();
            // ---- online softmax statistics, one warp per row; P rounded to bf16 for the tensor cores, and
            // the row sum taken of the rounded values
            for (int r = warp; r < TM; r += THREADS / 32) {
                bf16_t* pr = Ps + r * PSTR;
                softmax_tile_row<MLA_TILE_N>(Ss + r * SSTR, m_split + r, l_split + r, alpha + r, lane, [&](int c, float p) {
                    const bf16_t rounded = float_to_bf16(p);
                    pr[c] = rounded;
                    return bf16_to_float(rounded);
                });
            }
            __syncthreads();
            // ---- acc = acc * alpha + P V (V: the first L columns of the key rows), keys in order
            {
                const float a0 = alpha[r0], a1 = alpha[r1];
#pragma unroll
                for (int i = 0; i < NW; ++i) {
                    acc[i][0] = __fmul_rn(acc[i][0], a0);
                    acc[i][1] = __fmul_rn(acc[i][1], a0);
                    acc[i][2] = __fmul_rn(acc[i][2], a1);
                    acc[i][3] = __fmul_rn(acc[i][3], a1);
                }
                const bf16_t* pa = Ps + (mi * 16 + (lane & 15)) * PSTR + (lane >> 4) * 8;
                const bf16_t* vb = Kb + (lane & 15) * stride + wq * NW * 8;
#pragma unroll
                for (int k0 = 0; k0 < MLA_TILE_N; k0 += 16) {
                    unsigned a[4];
                    ldsm_x4(pa + k0, a);
#pragma unroll
                    for (int i = 0; i < NW; ++i) {
                        if ((wq * NW + i) * 8 < L) {  // warp-uniform
                            unsigned bb[2];
                            ldsm_x2_trans(vb + k0 * stride + i * 8, bb);
                            mma_16816(acc[i], a[0], a[1], a[2], a[3], bb[0], bb[1]);
                        }
                    }
                }
            }
            __syncthreads();  // every thread is done with this tile before its buffer is refilled
            if (buffers == 1 && it + 1 < tiles) {
                load_latent_tile(KV, kslot + (it + 1) * MLA_TILE_N, cache, W, stride, tid, THREADS);
                cp_async_commit();
            }
        }
        __syncthreads();  // m_split / l_split final for this split
        if (only_split >= 0) {
            // split mode: this split's (max, sum) and accumulator go to the workspace
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = half ? r1 : r0;
                const int tok = r / hpt, h = h0 + r % hpt;
                if (tok < tokens && h < heads) {
                    const long long at = ((long long)(q_begin + tile_tok + tok) * heads + h) * splits + s;
                    if (wq == 0 && tq == 0) ws_ml[at] = make_float2(m_split[r], l_split[r]);
                    if (tiles > 0) {
#pragma unroll
                        for (int i = 0; i < NW; ++i) {
                            const int col = (wq * NW + i) * 8 + 2 * tq;
                            if (col < L) ws_acc[at * L + col] = acc[i][2 * half];
                            if (col + 1 < L) ws_acc[at * L + col + 1] = acc[i][2 * half + 1];
                        }
                    }
                }
            }
        } else {
            // direct mode: fold the split into the running output, as `combine_splits` does
            for (int r = tid; r < TM; r += THREADS) {
                take[r] = m_split[r] != NEG_INF;
                if (take[r]) {
                    float a, bb, M_new;
                    merge_factors(M_tot[r], m_split[r], &a, &bb, &M_new);
                    fa[r] = a;
                    fb[r] = bb;
                    L_tot[r] = merge_value(L_tot[r], a, l_split[r], bb);
                    M_tot[r] = M_new;
                }
            }
            __syncthreads();
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = half ? r1 : r0;
                if (take[r]) {
                    const float a = fa[r], bb = fb[r];
#pragma unroll
                    for (int i = 0; i < NW; ++i) {
                        O[i][2 * half] = merge_value(O[i][2 * half], a, acc[i][2 * half], bb);
                        O[i][2 * half + 1] = merge_value(O[i][2 * half + 1], a, acc[i][2 * half + 1], bb);
                    }
                }
            }
        }
    }
    if (only_split < 0) {
        __syncthreads();
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int r = half ? r1 : r0;
            const int tok = r / hpt, h = h0 + r % hpt;
            if (tok < tokens && h < heads) {
                const long long t = q_begin + tile_tok + tok;
                const float Lr = L_tot[r];
#pragma unroll
                for (int i = 0; i < NW; ++i) {
                    const int col = (wq * NW + i) * 8 + 2 * tq;
#pragma unroll
                    for (int e = 0; e < 2; ++e)
                        if (col + e < L)
                            out[t * o_s0 + h * o_s1 + col + e] =
                                float_to_bf16(Lr > 0.0f ? __fdiv_rn(O[i][2 * half + e], Lr) : 0.0f);
                }
            }
        }
    }
}

#define MLA_ATTENTION_KERNEL(MT, NW)                                                                                   \
    extern "C" __global__ void __launch_bounds__(128 * MT) mla_attention_m##MT##_n##NW(                               \
        const bf16_t* __restrict__ q_lat, long long ql_s0, long long ql_s1, const bf16_t* __restrict__ q_rope,         \
        long long qr_s0, long long qr_s1, const bf16_t* __restrict__ cache, const int* __restrict__ query_start,      \
        const int* __restrict__ seq_lens, const int* __restrict__ block_tables, int table_width,                      \
        const int4* __restrict__ work, bf16_t* __restrict__ out, long long o_s0, long long o_s1,                      \
        float* __restrict__ ws_acc, float2* __restrict__ ws_ml, int splits, int heads, int hpt, int L, int R,         \
        int block_size, float scale, const float* __restrict__ row_scale, int buffers) { await_inputs();              \
        mla_attention_body<MT, NW>(q_lat, ql_s0, ql_s1, q_rope, qr_s0, qr_s1, cache, query_start, seq_lens,           \
                                   block_tables, table_width, work, out, o_s0, o_s1, ws_acc, ws_ml, splits, heads,    \
                                   hpt, L, R, block_size, scale, row_scale, buffers);                                 \
    }

// NW: latent widths up to 32, 64, 128, 256 and 512; MT 1: decode-sized blocks, 2: prefill-sized.
MLA_ATTENTION_KERNEL(1, 1)
MLA_ATTENTION_KERNEL(1, 2)
MLA_ATTENTION_KERNEL(1, 4)
MLA_ATTENTION_KERNEL(1, 8)
MLA_ATTENTION_KERNEL(1, 16)
MLA_ATTENTION_KERNEL(2, 1)
MLA_ATTENTION_KERNEL(2, 2)
MLA_ATTENTION_KERNEL(2, 4)
MLA_ATTENTION_KERNEL(2, 8)
MLA_ATTENTION_KERNEL(2, 16)

// Merge the split partials of every (token, head) row (`combine_splits`): latent widths up to 512.
extern "C" __global__ void mla_combine(const float* __restrict__ ws_acc, const float2* __restrict__ ws_ml, int splits,
                                       bf16_t* __restrict__ out, long long o_s0, long long o_s1, int heads, int L,
                                       long long rows) {
    await_inputs();
    combine_splits<16>(ws_acc, ws_ml, splits, out, o_s0, o_s1, heads, L, rows, 1.0f);
}
