// Query rows and paged key/value tiles into shared memory, shared by the attention kernels (attention.cu,
// attention_mma.cu).
//
// The caches hold bf16 (kv_t = bf16_t), or FP8 E4M3 bytes when compiled with KV_FP8=1 (the ``fp8`` KV cache
// dtype): tiles then hold the bytes (half the shared memory and copies), and each element is read as its exact
// bf16 value (`tile_chunk`, `tile_values`; `unstage_kv_tile` for the tensor-core kernel's ldmatrix), so the
// kernels' arithmetic is the same; the layer's key scale is folded into the softmax scale and its value scale
// multiplies the output (the kernels' ``v_scale``).
#pragma once
#include "fp8.cuh"
#include "splits.cuh"

#ifndef KV_FP8
#define KV_FP8 0
#endif
#if KV_FP8
typedef unsigned char kv_t;
#else
typedef bf16_t kv_t;
#endif

// Rows of `stride` elements: the offset of row r's column j.
struct RowStride {
    int stride;
    __device__ __forceinline__ int operator()(int r, int j) const { return r * stride + j; }
};

// Zeros in columns d_pad .. d_full - 1 (multiples of 8) of `rows` key rows and value rows (row r's columns j .. j + 7
// at Kb + at(r, j) and Vb + at(r, j)), by THREADS threads: the tile loads write columns below d_pad only, so the
// padding of heads narrower than the kernel's stays zero.
template <int THREADS, class Offset>
__device__ __forceinline__ void zero_tile_columns(bf16_t* Kb, bf16_t* Vb, Offset at, int rows, int d_pad, int d_full,
                                                  int tid) {
    const int pad_chunks = (d_full - d_pad) / 8;
    for (int i = tid; i < rows * pad_chunks; i += THREADS) {
        const int row = i / pad_chunks, j = d_pad + (i - row * pad_chunks) * 8;
        const uint4 zero = {0u, 0u, 0u, 0u};
        *reinterpret_cast<uint4*>(Kb + at(row, j)) = zero;
        *reinterpret_cast<uint4*>(Vb + at(row, j)) = zero;
    }
}

#if KV_FP8
// Start copying one tile of TILE_N keys and values into shared memory as their E4M3 bytes (rows of `stride`
// bytes, columns 0 .. d_pad - 1 with d_pad = d rounded up to 8; 8-byte asynchronous copies when d % 8 == 0,
// plain loads otherwise; keys without a slot (-1) become zeros), by THREADS threads. Kernels read the rows
// through `tile_chunk` / `tile_values`, or `unstage_kv_tile` turns them into bf16 rows.
template <int TILE_N, int THREADS>
__device__ __forceinline__ void load_kv_tile(kv_t* Kb, kv_t* Vb, const long long* slots,
                                             const kv_t* __restrict__ k_cache, const kv_t* __restrict__ v_cache,
                                             int kv_heads, int hk, int d, int d_pad, int stride, int tid) {
    const int chunks = d_pad / 8;
    for (int i = tid; i < TILE_N * chunks; i += THREADS) {
        const int c = i / chunks, j = (i - c * chunks) * 8;
        const long long slot = slots[c];
        kv_t* kdst = Kb + c * stride + j;
        kv_t* vdst = Vb + c * stride + j;
        const long long base = (slot * kv_heads + hk) * d + j;
        if (slot >= 0 && (d & 7) == 0) {
            cp_async8(kdst, k_cache + base);
            cp_async8(vdst, v_cache + base);
            continue;
        }
        uint2 kw = make_uint2(0u, 0u), vw = make_uint2(0u, 0u);
        for (int e = 0; slot >= 0 && e < 8 && j + e < d; ++e) {
            (e < 4 ? kw.x : kw.y) |= (unsigned)k_cache[base + e] << (8 * (e & 3));
            (e < 4 ? vw.x : vw.y) |= (unsigned)v_cache[base + e] << (8 * (e & 3));
        }
        *reinterpret_cast<uint2*>(kdst) = kw;
        *reinterpret_cast<uint2*>(vdst) = vw;
    }
}

// A tile's E4M3 rows (copies complete and visible to the block) as bf16 key and value rows, both `stride` wide
// (bytes and elements), columns 0 .. d_pad - 1, by THREADS threads.
template <int TILE_N, int THREADS>
__device__ __forceinline__ void unstage_kv_tile(bf16_t* Kb, bf16_t* Vb, const kv_t* Kst, const kv_t* Vst, int d_pad,
                                                int stride, int tid) {
    const int chunks = d_pad / 8;
    for (int i = tid; i < 2 * TILE_N * chunks; i += THREADS) {
        const int r = i / chunks, j = (i - r * chunks) * 8;  // rows 0 .. TILE_N - 1: keys; then values
        const kv_t* src = (r < TILE_N ? Kst + r * stride : Vst + (r - TILE_N) * stride) + j;
        const uint2 raw = *reinterpret_cast<const uint2*>(src);
        bf16_t* dst = (r < TILE_N ? Kb + r * stride : Vb + (r - TILE_N) * stride) + j;
        *reinterpret_cast<uint4*>(dst) = e4m3x8_to_bf16x8(raw);
    }
}
#else
// Start copying one tile of TILE_N keys and values into shared memory (columns 0 .. d_pad - 1 with d_pad = d
// rounded up to 8, key c's columns j .. j + 7 at Kb + at(c, j) and Vb + at(c, j); 16-byte asynchronous copies
// when the head dim allows, plain loads otherwise; keys without a slot (-1) become zeros), by THREADS threads.
// ROW_CHUNKS: a compile-time bound on d_pad / 8 (chunks past d_pad are skipped), or 0 for none.
template <int TILE_N, int THREADS, int ROW_CHUNKS, class Offset>
__device__ __forceinline__ void load_kv_tile_at(bf16_t* Kb, bf16_t* Vb, Offset at, const long long* slots,
                                                const kv_t* __restrict__ k_cache, const kv_t* __restrict__ v_cache,
                                                int kv_heads, int hk, int d, int d_pad, int tid) {
    const int chunks = ROW_CHUNKS > 0 ? ROW_CHUNKS : d_pad / 8;
#pragma unroll
    for (int i = tid; i < TILE_N * chunks; i += THREADS) {
        const int c = i / chunks, j = (i - c * chunks) * 8;
        if (ROW_CHUNKS > 0 && j >= d_pad) continue;
        const long long slot = slots[c];
        bf16_t* kdst = Kb + at(c, j);
        bf16_t* vdst = Vb + at(c, j);
        if (slot < 0) {
            const uint4 zero = {0u, 0u, 0u, 0u};
            *reinterpret_cast<uint4*>(kdst) = zero;
            *reinterpret_cast<uint4*>(vdst) = zero;
            continue;
        }
        const long long base = (slot * kv_heads + hk) * d + j;
        if ((d & 7) == 0) {
            cp_async16(kdst, k_cache + base);
            cp_async16(vdst, v_cache + base);
        } else {
            unsigned kw[4], vw[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const bool in0 = j + 2 * e < d, in1 = j + 2 * e + 1 < d;
                kw[e] = (in0 ? (unsigned)k_cache[base + 2 * e] : 0u) | ((in1 ? (unsigned)k_cache[base + 2 * e + 1] : 0u) << 16);
                vw[e] = (in0 ? (unsigned)v_cache[base + 2 * e] : 0u) | ((in1 ? (unsigned)v_cache[base + 2 * e + 1] : 0u) << 16);
            }
            const uint4 kv4 = {kw[0], kw[1], kw[2], kw[3]}, vv4 = {vw[0], vw[1], vw[2], vw[3]};
            *reinterpret_cast<uint4*>(kdst) = kv4;
            *reinterpret_cast<uint4*>(vdst) = vv4;
        }
    }
}

// load_kv_tile_at into rows of `stride` elements.
template <int TILE_N, int THREADS>
__device__ __forceinline__ void load_kv_tile(bf16_t* Kb, bf16_t* Vb, const long long* slots,
                                             const kv_t* __restrict__ k_cache, const kv_t* __restrict__ v_cache,
                                             int kv_heads, int hk, int d, int d_pad, int stride, int tid) {
    load_kv_tile_at<TILE_N, THREADS, 0>(Kb, Vb, RowStride{stride}, slots, k_cache, v_cache, kv_heads, hk, d, d_pad, tid);
}
#endif

// The flat KV slots of the TILE_N keys from first_key (keys outside [key_start, key_end): -1), by THREADS threads.
template <int TILE_N, int THREADS>
__device__ __forceinline__ void tile_slots(long long* slots, const int* table, int first_key, int key_start,
                                           int key_end, int block_size, int tid) {
    for (int c = tid; c < TILE_N; c += THREADS) {
        const int kpos = first_key + c;
        slots[c] = (kpos >= key_start && kpos < key_end)
                       ? (long long)table[kpos / block_size] * block_size + kpos % block_size
                       : -1;
    }
}

// Elements j .. j + 7 of a tile row as 8 bf16 values (16-byte and 8-byte aligned rows, bf16 and E4M3).
__device__ __forceinline__ uint4 tile_chunk(const bf16_t* row, int j) { return *reinterpret_cast<const uint4*>(row + j); }
__device__ __forceinline__ uint4 tile_chunk(const unsigned char* row, int j) {
    return e4m3x8_to_bf16x8(*reinterpret_cast<const uint2*>(row + j));
}

// Elements d0 .. d0 + N - 1 of a tile row (N = 1, 2, 4, 8 or 16; d0 a multiple of N) as floats.
template <int N>
__device__ __forceinline__ void tile_values(const bf16_t* row, int d0, float* v) {
    if (N == 16) {
        tile_values<8>(row, d0, v);
        tile_values<8>(row, d0 + 8, v + 8);
    } else if (N == 8) {
        const uint4 w = *reinterpret_cast<const uint4*>(row + d0);
        v[0] = bf16_lo(w.x); v[1] = bf16_hi(w.x); v[2] = bf16_lo(w.y); v[3] = bf16_hi(w.y);
        v[4] = bf16_lo(w.z); v[5] = bf16_hi(w.z); v[6] = bf16_lo(w.w); v[7] = bf16_hi(w.w);
    } else if (N == 4) {
        const uint2 w = *reinterpret_cast<const uint2*>(row + d0);
        v[0] = bf16_lo(w.x); v[1] = bf16_hi(w.x); v[2] = bf16_lo(w.y); v[3] = bf16_hi(w.y);
    } else if (N == 2) {
        const unsigned w = *reinterpret_cast<const unsigned*>(row + d0);
        v[0] = bf16_lo(w); v[1] = bf16_hi(w);
    } else {
        v[0] = bf16_to_float(row[d0]);
    }
}

template <int N>
__device__ __forceinline__ void tile_values(const unsigned char* row, int d0, float* v) {
    if (N >= 4) {
#pragma unroll
        for (int q = 0; q < N / 4; ++q) {
            const unsigned w = *reinterpret_cast<const unsigned*>(row + d0 + 4 * q);
            unsigned lo, hi;
            e4m3x4_to_bf16x2(w, lo, hi);
            v[4 * q] = bf16_lo(lo); v[4 * q + 1] = bf16_hi(lo); v[4 * q + 2] = bf16_lo(hi); v[4 * q + 3] = bf16_hi(hi);
        }
    } else {
#pragma unroll
        for (int e = 0; e < N; ++e) v[e] = __uint_as_float(e4m3_to_bf16_bits(row[d0 + e]) << 16);
    }
}

// Query rows of a work item into shared memory: row r (< rows) is query token `first_token + r / group`, head
// `hk * group + r % group`; `chunks` 8-element chunks of each of `tile_rows` rows, row r's columns j .. j + 7 at
// Qs + at(r, j) (columns from d on, and rows from `rows` on, become zeros). q_vec: 16-byte asynchronous copies
// (d % 8 == 0 and aligned rows), which the caller's next cp.async commit and wait cover (the first key tile's),
// so that they overlap the block-table reads.
template <int THREADS, class Offset>
__device__ __forceinline__ void load_q_rows_at(bf16_t* Qs, Offset at, const bf16_t* __restrict__ q, long long q_s0,
                                               long long q_s1, long long first_token, int tile_rows, int rows,
                                               int group, int hk, int d, int chunks, int q_vec, int tid) {
    for (int i = tid; i < tile_rows * chunks; i += THREADS) {
        const int r = i / chunks, j = (i - r * chunks) * 8;
        uint4 v = {0u, 0u, 0u, 0u};
        if (r < rows && j < d) {
            const bf16_t* src = q + (first_token + r / group) * q_s0 + (long long)(hk * group + r % group) * q_s1 + j;
            if (q_vec) {
                cp_async16(Qs + at(r, j), src);
                continue;
            } else {
                unsigned w[4];
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    w[e] = (j + 2 * e < d ? (unsigned)src[2 * e] : 0u) | ((j + 2 * e + 1 < d ? (unsigned)src[2 * e + 1] : 0u) << 16);
                v.x = w[0]; v.y = w[1]; v.z = w[2]; v.w = w[3];
            }
        }
        *reinterpret_cast<uint4*>(Qs + at(r, j)) = v;
    }
}

// load_q_rows_at into rows of `stride` elements.
template <int THREADS>
__device__ __forceinline__ void load_q_rows(bf16_t* Qs, int stride, const bf16_t* __restrict__ q, long long q_s0,
                                            long long q_s1, long long first_token, int tile_rows, int rows,
                                            int group, int hk, int d, int chunks, int q_vec, int tid) {
    load_q_rows_at<THREADS>(Qs, RowStride{stride}, q, q_s0, q_s1, first_token, tile_rows, rows, group, hk, d, chunks,
                            q_vec, tid);
}

// The parameters of attention.cu's kernels, which attention_decode.cu's take too (one argument list on the host:
// attention.py's `_kernel_args`), and the same names as arguments.
#define ATTENTION_PARAMS                                                                                              \
    const bf16_t *__restrict__ q, long long q_s0, long long q_s1, const kv_t *__restrict__ k_cache,                   \
        const kv_t *__restrict__ v_cache, const int *__restrict__ query_start, const int *__restrict__ seq_lens,      \
        const int *__restrict__ block_tables, int table_width, const int4 *__restrict__ work,                         \
        bf16_t *__restrict__ out, long long o_s0, long long o_s1, float *__restrict__ ws_acc,                         \
        float2 *__restrict__ ws_ml, int splits, int q_heads, int kv_heads, int d, int block_size, float scale,        \
        float v_scale, int window, int q_vec, const int *__restrict__ visible_end
#define ATTENTION_ARGS                                                                                                \
    q, q_s0, q_s1, k_cache, v_cache, query_start, seq_lens, block_tables, table_width, work, out, o_s0, o_s1, ws_acc, \
        ws_ml, splits, q_heads, kv_heads, d, block_size, scale, v_scale, window, q_vec, visible_end

// A work item (sequence b, its query tokens from tile_tok, at most tile_rows rows of (token, head of the GQA
// group)): the rows that exist (0: nothing to do), the first token's position, and the keys [key_start,
// key_end) any of its rows sees. visible_end is non-decreasing along a sequence's rows, so the last row sees
// the furthest (never past the sequence's keys, whatever the caller passes).
struct WorkRows {
    int q_begin, tile_tok, q_len, ctx, group, tokens, rows, first_pos, key_start, key_end;
};

__device__ __forceinline__ WorkRows work_rows(const int* __restrict__ query_start, const int* __restrict__ seq_lens,
                                              int b, int tile_tok, int tile_rows, int group, int window,
                                              const int* __restrict__ visible_end) {
    WorkRows w;
    w.q_begin = query_start[b];
    w.tile_tok = tile_tok;
    w.q_len = query_start[b + 1] - w.q_begin;
    w.ctx = seq_lens[b];
    w.group = group;
    w.tokens = min(tile_rows / group, w.q_len - tile_tok);
    w.rows = max(w.tokens, 0) * group;
    w.first_pos = w.ctx - w.q_len + tile_tok;
    const int last_pos = w.first_pos + w.tokens - 1;
    w.key_end = visible_end && w.tokens > 0
                    ? min(w.ctx, max(last_pos + 1, visible_end[w.q_begin + tile_tok + w.tokens - 1]))
                    : last_pos + 1;
    w.key_start = window > 0 ? max(0, w.first_pos - window + 1) : 0;
    return w;
}

// This block's work item (item `item_index` of `work`, blockIdx.x unless given: sequence, first query token, split
// or -1 for all of them; the KV head `head`, blockIdx.y unless given): its rows (`work_rows`, tile_rows at most), its GQA group and the sequence's block table.
struct BlockWork {
    WorkRows w;
    int split, hk, group;
    const int* table;
};

__device__ __forceinline__ BlockWork block_work(const int4* __restrict__ work, const int* __restrict__ query_start,
                                                const int* __restrict__ seq_lens, const int* __restrict__ block_tables,
                                                int table_width, int q_heads, int kv_heads, int tile_rows, int window,
                                                const int* __restrict__ visible_end, int item_index = blockIdx.x,
                                                int head = blockIdx.y) {
    const int4 item = work[item_index];
    BlockWork bw;
    bw.group = q_heads / kv_heads;
    bw.w = work_rows(query_start, seq_lens, item.x, item.y, tile_rows, bw.group, window, visible_end);
    bw.split = item.z;
    bw.hk = head;
    bw.table = block_tables + (long long)item.x * table_width;
    return bw;
}

// The splits of split_keys keys a block walks, first and last: its own (split mode) or every split holding keys
// its rows see (direct mode; none when they see no key). Every block's running (max, sum) of its rows starts at
// (-inf, 0): `reset_running`.
__device__ __forceinline__ int2 split_range(const BlockWork& bw, int split_keys) {
    if (bw.split >= 0) return make_int2(bw.split, bw.split);
    return make_int2(bw.w.key_start / split_keys, bw.w.key_end > 0 ? (bw.w.key_end - 1) / split_keys : -1);
}

template <int THREADS>
__device__ __forceinline__ void reset_running(float* m, float* l, int tile_rows, int tid) {
    for (int r = tid; r < tile_rows; r += THREADS) {
        m[r] = NEG_INF;
        l[r] = 0.0f;
    }
}

// Each row's position (qpos) and the last key it sees (qlast: its position, or its image's end - 1), -1 for
// rows past those that exist, for rows 0 .. tile_rows - 1.
template <int THREADS>
__device__ __forceinline__ void row_positions(int* qpos, int* qlast, const WorkRows& w, int tile_rows,
                                              const int* __restrict__ visible_end, int tid) {
    for (int r = tid; r < tile_rows; r += THREADS) {
        const bool real = r < w.rows;
        qpos[r] = real ? w.first_pos + r / w.group : -1;
        qlast[r] = real ? (visible_end ? min(w.ctx, visible_end[w.q_begin + w.tile_tok + r / w.group]) - 1 : qpos[r])
                        : -1;
    }
}
