// Causal paged attention with GQA and an optional sliding window, for varlen batches that mix prefill
// chunks and decode tokens; FlashAttention-2 style online softmax over key tiles, with split-K
// ("flash-decoding") over the context for long decodes.
//
// A block handles one work item (sequence b, its query tokens tile_tok .., a split or all of them) for
// one KV head; its rows are (query token, query head of the group) pairs, so a decode token brings its
// whole GQA group. Keys are processed in tiles of ATT_TILE_N aligned to key 0, grouped in splits of
// ATT_SPLIT keys. For every row the arithmetic is fixed by the row alone: each split is an online
// softmax over its tiles in order (a score is one thread's sequential dot product; a row's sum and each
// output element are accumulated in key order), and splits are merged in order with `merge_split`.
// Direct mode (split < 0) merges the splits in the block and writes the output; split mode writes the
// split's (max, sum, accumulator) to a workspace and `attention_combine` merges them. Both give the
// same bits, so a token's attention does not depend on what else is in the batch or how it is split.
#include "paged_kv.cuh"

#ifndef ATT_TILE_N
#define ATT_TILE_N 64
#endif
#ifndef ATT_SPLIT
#define ATT_SPLIT 64
#endif
#define ATT_THREADS 128
// Decode-sized blocks (16 rows) double-buffer the key/value tiles so that the next tile loads while
// this one is computed; prefill-sized blocks (64 rows) keep one buffer, and so twice the blocks per SM.
// Heads wider than 256 (DPT 16, 16-row blocks only) keep one buffer, and their running output in
// registers rather than shared memory (O_REGS), to fit GB10's 99 KiB. FP8 caches' tiles hold bytes
// (kv_t, paged_kv.cuh): rows of the same `stride`, half the shared memory.
#define ATT_BUFFERS(TM, DPT) ((TM) == 16 && (DPT) <= 8 ? 2 : 1)

template <int TM, int DPT>
__device__ __forceinline__ void attention_body(ATTENTION_PARAMS) {
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int BUFFERS = ATT_BUFFERS(TM, DPT);
    constexpr bool O_REGS = DPT > 8;  // direct mode's running output: registers, else shared memory (Ot)
    const int d_pad = (d + 7) & ~7;
    const int stride = d_pad + 8;  // padded rows: conflict-free 16-byte reads across rows
    long long* kslot = reinterpret_cast<long long*>(smem);  // flat KV slot of each key of the split, -1: none
    bf16_t* Qs = reinterpret_cast<bf16_t*>(kslot + ATT_SPLIT);
    kv_t* Ks = reinterpret_cast<kv_t*>(Qs + TM * stride);  // BUFFERS tile buffers each for keys and values
    kv_t* Vs = Ks + BUFFERS * ATT_TILE_N * stride;
    float* Ps = reinterpret_cast<float*>(Vs + BUFFERS * ATT_TILE_N * stride);
    float* Ot = Ps + TM * (ATT_TILE_N + 1);
    float* m_split = Ot + (O_REGS ? 0 : TM * 32 * DPT);
    float* l_split = m_split + TM;
    float* alpha = l_split + TM;
    float* M_tot = alpha + TM;
    float* L_tot = M_tot + TM;
    int* qpos = reinterpret_cast<int*>(L_tot + TM);
    int* qlast = qpos + TM;  // the last key each row sees: its position, or its image's end - 1 (visible_end)

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const BlockWork bw = block_work(work, query_start, seq_lens, block_tables, table_width, q_heads, kv_heads,
                                    TM, window, visible_end);
    const WorkRows& w = bw.w;
    const int q_begin = w.q_begin, tile_tok = w.tile_tok, rows = w.rows, key_start = w.key_start, key_end = w.key_end;
    const int hk = bw.hk, group = bw.group, only_split = bw.split;
    if (rows <= 0) return;
    const int* table = bw.table;

    row_positions<ATT_THREADS>(qpos, qlast, w, TM, visible_end, tid);
    reset_running<ATT_THREADS>(M_tot, L_tot, TM, tid);
    if (!O_REGS && only_split < 0)
        for (int i = tid; i < TM * 32 * DPT; i += ATT_THREADS) Ot[i] = 0.0f;
    load_q_rows<ATT_THREADS>(Qs, stride, q, q_s0, q_s1, q_begin + tile_tok, TM, rows, group, hk, d, d_pad / 8, q_vec, tid);

    const int2 split_span = split_range(bw, ATT_SPLIT);

    constexpr int ROW_GROUPS = ATT_THREADS / ATT_TILE_N;  // score layout: column c = tid % TILE_N
    constexpr int SROWS = TM / ROW_GROUPS;
    const int c_own = tid % ATT_TILE_N, rg = tid / ATT_TILE_N;
    constexpr int PROWS = TM / 4;  // PV layout: rows warp + 4i, dims lane * DPT + e
    const int d_own = lane * DPT;
    float O[O_REGS ? PROWS : 1][O_REGS ? DPT : 1];  // O_REGS: this thread's part of the running output
#pragma unroll
    for (int i = 0; i < (O_REGS ? PROWS : 1); ++i)
#pragma unroll
        for (int e = 0; e < (O_REGS ? DPT : 1); ++e) O[i][e] = 0.0f;

    for (int s = split_span.x; s <= split_span.y; ++s) {
        __syncthreads();  // the previous split's merge has read its statistics
        float acc[PROWS][DPT];
#pragma unroll
        for (int i = 0; i < PROWS; ++i)
#pragma unroll
            for (int e = 0; e < DPT; ++e) acc[i][e] = 0.0f;
        for (int r = tid; r < TM; r += ATT_THREADS) {
            m_split[r] = NEG_INF;
            l_split[r] = 0.0f;
        }
        const int tile_lo = max(s * ATT_SPLIT, key_start / ATT_TILE_N * ATT_TILE_N);
        const int tile_hi = min((s + 1) * ATT_SPLIT, key_end);
        const int tiles = tile_hi > tile_lo ? (tile_hi - tile_lo + ATT_TILE_N - 1) / ATT_TILE_N : 0;
        __syncthreads();  // the previous split is done with kslot and the K/V buffers
        // flat KV slot of every key of the split's tiles (-1: outside [key_start, key_end)), in one pass
        for (int c = tid; c < tiles * ATT_TILE_N; c += ATT_THREADS) {
            const int kpos = tile_lo + c;
            kslot[c] = (kpos >= key_start && kpos < key_end)
                           ? (long long)table[kpos / block_size] * block_size + kpos % block_size
                           : -1;
        }
        __syncthreads();
        if (tiles > 0) load_kv_tile<ATT_TILE_N, ATT_THREADS>(Ks, Vs, kslot, k_cache, v_cache, kv_heads, hk, d, d_pad, stride, tid);
        cp_async_commit();
        for (int it = 0; it < tiles; ++it) {
            const int t0 = tile_lo + it * ATT_TILE_N;
            const kv_t* Kb = Ks + (BUFFERS == 2 ? (it & 1) : 0) * ATT_TILE_N * stride;
            const kv_t* Vb = Vs + (BUFFERS == 2 ? (it & 1) : 0) * ATT_TILE_N * stride;
            if (BUFFERS == 2 && it + 1 < tiles) {  // the next tile streams in while this one is computed
                load_kv_tile<ATT_TILE_N, ATT_THREADS>(Ks + ((it + 1) & 1) * ATT_TILE_N * stride, Vs + ((it + 1) & 1) * ATT_TILE_N * stride,
                             kslot + (it + 1) * ATT_TILE_N, k_cache, v_cache, kv_heads, hk, d, d_pad, stride, tid);
                cp_async_commit();
                cp_async_wait_one();
            } else {
                cp_async_wait_all();
            }
            __syncthreads();
            // ---- scores: one thread per (row, key), sequential over the head dims
            {
                const int kpos = t0 + c_own;
                float sc[SROWS];
#pragma unroll
                for (int i = 0; i < SROWS; ++i) sc[i] = 0.0f;
                const kv_t* krow = Kb + c_own * stride;
                for (int j = 0; j < d_pad; j += 8) {
                    const uint4 kw = tile_chunk(krow, j);
                    const float kf[8] = {bf16_lo(kw.x), bf16_hi(kw.x), bf16_lo(kw.y), bf16_hi(kw.y),
                                         bf16_lo(kw.z), bf16_hi(kw.z), bf16_lo(kw.w), bf16_hi(kw.w)};
#pragma unroll
                    for (int i = 0; i < SROWS; ++i) {
                        const int r = rg + ROW_GROUPS * i;
                        if (r < rows) {
                            const uint4 qw = *reinterpret_cast<const uint4*>(Qs + r * stride + j);
                            float acc_s = sc[i];
                            acc_s = __fmaf_rn(bf16_lo(qw.x), kf[0], acc_s);
                            acc_s = __fmaf_rn(bf16_hi(qw.x), kf[1], acc_s);
                            acc_s = __fmaf_rn(bf16_lo(qw.y), kf[2], acc_s);
                            acc_s = __fmaf_rn(bf16_hi(qw.y), kf[3], acc_s);
                            acc_s = __fmaf_rn(bf16_lo(qw.z), kf[4], acc_s);
                            acc_s = __fmaf_rn(bf16_hi(qw.z), kf[5], acc_s);
                            acc_s = __fmaf_rn(bf16_lo(qw.w), kf[6], acc_s);
                            acc_s = __fmaf_rn(bf16_hi(qw.w), kf[7], acc_s);
                            sc[i] = acc_s;
                        }
                    }
                }
#pragma unroll
                for (int i = 0; i < SROWS; ++i) {
                    const int r = rg + ROW_GROUPS * i;
                    if (r < rows) {
                        const int p = qpos[r];
                        const bool visible =
                            kpos <= qlast[r] && kpos >= key_start && (window <= 0 || kpos > p - window);
                        Ps[r * (ATT_TILE_N + 1) + c_own] = visible ? __fmul_rn(sc[i], scale) : NEG_INF;
                    }
                }
            }
            __syncthreads();
            // ---- online softmax statistics, one warp per row; P overwrites the scores
            for (int r = warp; r < rows; r += ATT_THREADS / 32) {
                float* pr = Ps + r * (ATT_TILE_N + 1);
                softmax_tile_row<ATT_TILE_N>(pr, m_split + r, l_split + r, alpha + r, lane, [&](int c, float p) {
                    pr[c] = p;
                    return p;
                });
            }
            __syncthreads();
            // ---- acc = acc * alpha + P V, keys in order
#pragma unroll
            for (int i = 0; i < PROWS; ++i) {
                const int r = warp + 4 * i;
                if (r < rows && d_own < d) {
                    const float a = alpha[r];
                    const float* pr = Ps + r * (ATT_TILE_N + 1);
                    float o[DPT];
#pragma unroll
                    for (int e = 0; e < DPT; ++e) o[e] = __fmul_rn(acc[i][e], a);
                    for (int c = 0; c < ATT_TILE_N; ++c) {
                        float v[DPT];
                        tile_values<DPT>(Vb + c * stride, d_own, v);
                        const float p = pr[c];
#pragma unroll
                        for (int e = 0; e < DPT; ++e) o[e] = __fmaf_rn(p, v[e], o[e]);
                    }
#pragma unroll
                    for (int e = 0; e < DPT; ++e) acc[i][e] = o[e];
                }
            }
            __syncthreads();  // every thread is done with this buffer before it is refilled
            if (BUFFERS == 1 && it + 1 < tiles) {
                load_kv_tile<ATT_TILE_N, ATT_THREADS>(Ks, Vs, kslot + (it + 1) * ATT_TILE_N, k_cache, v_cache, kv_heads, hk, d, d_pad, stride, tid);
                cp_async_commit();
            }
        }
        cp_async_wait_all();  // an empty split never waited for the query rows' copies (load_q_rows)
        __syncthreads();  // m_split / l_split final for this split
        if (only_split >= 0) {
#pragma unroll
            for (int i = 0; i < PROWS; ++i) {
                const int r = warp + 4 * i;
                if (r < rows) {
                    const long long t = q_begin + tile_tok + r / group;
                    const long long row = t * q_heads + hk * group + r % group;
                    const long long at = row * splits + s;
                    if (lane == 0) {
                        float2 ml;
                        ml.x = m_split[r];
                        ml.y = l_split[r];
                        ws_ml[at] = ml;
                    }
#pragma unroll
                    for (int e = 0; e < DPT; ++e)
                        if (d_own + e < d) ws_acc[at * d + d_own + e] = acc[i][e];
                }
            }
        } else {
#pragma unroll
            for (int i = 0; i < PROWS; ++i) {
                const int r = warp + 4 * i;
                if (r < rows && m_split[r] != NEG_INF) {
                    float a, bb, M_new;
                    merge_factors(M_tot[r], m_split[r], &a, &bb, &M_new);
#pragma unroll
                    for (int e = 0; e < DPT; ++e) {
                        if constexpr (O_REGS)
                            O[i][e] = merge_value(O[i][e], a, acc[i][e], bb);
                        else
                            Ot[r * 32 * DPT + d_own + e] = merge_value(Ot[r * 32 * DPT + d_own + e], a, acc[i][e], bb);
                    }
                    __syncwarp();
                    if (lane == 0) {
                        L_tot[r] = merge_value(L_tot[r], a, l_split[r], bb);
                        M_tot[r] = M_new;
                    }
                }
            }
        }
    }
    if (O_REGS && only_split < 0) {
        __syncthreads();
#pragma unroll
        for (int i = 0; i < PROWS; ++i) {
            const int r = warp + 4 * i;
            if (r < rows) {
                const long long t = q_begin + tile_tok + r / group;
                const int h = hk * group + r % group;
                const float L = L_tot[r];
#pragma unroll
                for (int e = 0; e < DPT; ++e)
                    if (d_own + e < d)
                        out[t * o_s0 + h * o_s1 + d_own + e] = normalized_output(O[i][e], L, v_scale);
            }
        }
    } else if (only_split < 0) {
        __syncthreads();
        for (int i = tid; i < rows * d; i += ATT_THREADS) {
            const int r = i / d, j = i - r * d;
            const long long t = q_begin + tile_tok + r / group;
            const int h = hk * group + r % group;
            const float L = L_tot[r];
            out[t * o_s0 + h * o_s1 + j] = normalized_output(Ot[r * 32 * DPT + j], L, v_scale);
        }
    }
}

#define ATTENTION_KERNEL(TM, DPT)                                                                                     \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS) attention_m##TM##_d##DPT(ATTENTION_PARAMS) {            \
        await_inputs();                                                                                               \
        attention_body<TM, DPT>(ATTENTION_ARGS);                                                                      \
    }

ATTENTION_KERNEL(16, 1)
ATTENTION_KERNEL(16, 2)
ATTENTION_KERNEL(16, 4)
ATTENTION_KERNEL(16, 8)
ATTENTION_KERNEL(16, 16)
ATTENTION_KERNEL(64, 1)
ATTENTION_KERNEL(64, 2)
ATTENTION_KERNEL(64, 4)
ATTENTION_KERNEL(64, 8)

// Merge the split partials of every (token, head) row (`combine_splits`); head dims up to 32 * COMBINE_MAX_DPT.
#define COMBINE_MAX_DPT 16
extern "C" __global__ void attention_combine(const float* __restrict__ ws_acc, const float2* __restrict__ ws_ml,
                                             int splits, bf16_t* __restrict__ out, long long o_s0, long long o_s1,
                                             int q_heads, int d, long long rows, float v_scale) {
    await_inputs();
    combine_splits<COMBINE_MAX_DPT>(ws_acc, ws_ml, splits, out, o_s0, o_s1, q_heads, d, rows, v_scale);
}
