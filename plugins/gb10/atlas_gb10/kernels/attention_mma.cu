// Prefill attention on the tensor cores: FlashAttention-2's loop over key tiles with mma.sync.m16n8k16 (bf16
// in, fp32 accumulation; sm_80 and later, Hopper and GB10 alike) for the 64-row work items of an eager forward
// in direct mode (head dims up to 256). A block takes one item (sequence b, query tokens tile_tok ..) for one KV head; its rows are
// (query token, query head of the GQA group) pairs as in attention.cu, and so are the masks (causal or
// `visible_end`, sliding window) and the paged key/value tiles, streamed through shared memory with cp.async,
// double-buffered. Each of the 4 warps owns 16 rows: S = Q K^T for 64 keys, the online softmax in registers
// (each row's statistics shared by the 4 lanes that hold it), then O += P V with P rounded to bf16.
//
// A row's result depends on that row and its keys only (key tiles aligned to key 0, processed in order), so a
// token gets the same bits whatever else its tile or batch holds; the arithmetic differs from attention.cu's
// (tensor-core dot products, P in bf16), which is why the batch-invariant mode does not use this kernel.
#include "gemm_core.cuh"
#include "mma_frags.cuh"
#include "paged_kv.cuh"

#define MMA_TILE_N 64
#define MMA_ROWS 64
#define MMA_THREADS 128

// DK: the head dim padded to 16 * DK (columns past d are zeros in Q, K and V).
template <int DK>
__device__ __forceinline__ void attention_mma_body(
    const bf16_t* __restrict__ q, long long q_s0, long long q_s1, const kv_t* __restrict__ k_cache,
    const kv_t* __restrict__ v_cache, const int* __restrict__ query_start, const int* __restrict__ seq_lens,
    const int* __restrict__ block_tables, int table_width, const int4* __restrict__ work, bf16_t* __restrict__ out,
    long long o_s0, long long o_s1, int q_heads, int kv_heads, int d, int block_size, float scale, float v_scale,
    int window, int q_vec, const int* __restrict__ visible_end) {
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int D_PAD = 16 * DK;
    constexpr int STRIDE = D_PAD + 8;  // padded rows: conflict-free ldmatrix
    long long* kslot = reinterpret_cast<long long*>(smem);  // [2][MMA_TILE_N], one per buffer
    bf16_t* Qs = reinterpret_cast<bf16_t*>(kslot + 2 * MMA_TILE_N);
    bf16_t* Ks = Qs + MMA_ROWS * STRIDE;  // [2][MMA_TILE_N][STRIDE]
    bf16_t* Vs = Ks + 2 * MMA_TILE_N * STRIDE;
    int* qpos = reinterpret_cast<int*>(Vs + 2 * MMA_TILE_N * STRIDE);
    int* qlast = qpos + MMA_ROWS;
#if KV_FP8
    // FP8 caches compute from buffer 0 only; buffer 1's key rows hold the next tile's bytes, key rows then value
    // rows of STRIDE bytes (`load_kv_tile`), which `unstage_kv_tile` turns into buffer 0's bf16 rows
    kv_t* Kst = reinterpret_cast<kv_t*>(Ks + MMA_TILE_N * STRIDE);
    kv_t* Vst = Kst + MMA_TILE_N * STRIDE;
#endif

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const BlockWork bw = block_work(work, query_start, seq_lens, block_tables, table_width, q_heads, kv_heads,
                                    MMA_ROWS, window, visible_end);
    const WorkRows& w = bw.w;
    const int q_begin = w.q_begin, tile_tok = w.tile_tok, rows = w.rows, key_start = w.key_start, key_end = w.key_end;
    const int hk = bw.hk, group = bw.group;
    if (rows <= 0) return;
    const int* table = bw.table;
    const int d8 = (d + 7) & ~7;

    row_positions<MMA_THREADS>(qpos, qlast, w, MMA_ROWS, visible_end, tid);
    load_q_rows<MMA_THREADS>(Qs, STRIDE, q, q_s0, q_s1, q_begin + tile_tok, MMA_ROWS, rows, group, hk, d, D_PAD / 8,
                             q_vec, tid);
    if (d8 < D_PAD) {  // the tile loads write columns below d8 only: the rest of K and V stays zero
        const int pad_chunks = (D_PAD - d8) / 8;
        for (int i = tid; i < 2 * MMA_TILE_N * pad_chunks; i += MMA_THREADS) {
            const int row = i / pad_chunks, j = d8 + (i - row * pad_chunks) * 8;
            const uint4 zero = {0u, 0u, 0u, 0u};
            *reinterpret_cast<uint4*>(Ks + row * STRIDE + j) = zero;
            *reinterpret_cast<uint4*>(Vs + row * STRIDE + j) = zero;
        }
    }
    const int tile_lo = key_start / MMA_TILE_N * MMA_TILE_N;
    const int tiles = key_end > tile_lo ? (key_end - tile_lo + MMA_TILE_N - 1) / MMA_TILE_N : 0;
    if (tiles > 0) tile_slots<MMA_TILE_N, MMA_THREADS>(kslot, table, tile_lo, key_start, key_end, block_size, tid);
    __syncthreads();
#if KV_FP8
    if (tiles > 0) load_kv_tile<MMA_TILE_N, MMA_THREADS>(Kst, Vst, kslot, k_cache, v_cache, kv_heads, hk, d, d8, STRIDE, tid);
#else
    if (tiles > 0)
        load_kv_tile<MMA_TILE_N, MMA_THREADS>(Ks, Vs, kslot, k_cache, v_cache, kv_heads, hk, d, d8, STRIDE, tid);
#endif
    cp_async_commit();

    const int g = lane >> 2, qd = lane & 3;
    const int r0 = warp * 16 + g, r1 = r0 + 8;  // this lane's two rows
    const RowMasks masks{key_start, qlast[r0], qlast[r1], qpos[r0], qpos[r1], window};
    const float scale2 = scale * LOG2E;  // scores in log2 units: exp2f
    float o[2 * DK][4];
#pragma unroll
    for (int n = 0; n < 2 * DK; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;

    for (int it = 0; it < tiles; ++it) {
#if KV_FP8
        const int buf = 0;
        cp_async_wait_all();
        __syncthreads();
        unstage_kv_tile<MMA_TILE_N, MMA_THREADS>(Ks, Vs, Kst, Vst, d8, STRIDE, tid);
        if (it + 1 < tiles) tile_slots<MMA_TILE_N, MMA_THREADS>(kslot, table, tile_lo + (it + 1) * MMA_TILE_N, key_start, key_end, block_size, tid);
        __syncthreads();
        if (it + 1 < tiles) {  // the next tile's bytes stream in while this one is computed
            load_kv_tile<MMA_TILE_N, MMA_THREADS>(Kst, Vst, kslot, k_cache, v_cache, kv_heads, hk, d, d8, STRIDE, tid);
            cp_async_commit();
        }
#else
        const int buf = it & 1;
        if (it + 1 < tiles) {  // the next tile streams in while this one is computed
            long long* next_slots = kslot + (buf ^ 1) * MMA_TILE_N;
            tile_slots<MMA_TILE_N, MMA_THREADS>(next_slots, table, tile_lo + (it + 1) * MMA_TILE_N, key_start, key_end, block_size, tid);
            __syncthreads();
            load_kv_tile<MMA_TILE_N, MMA_THREADS>(Ks + (buf ^ 1) * MMA_TILE_N * STRIDE,
                                                  Vs + (buf ^ 1) * MMA_TILE_N * STRIDE, next_slots, k_cache, v_cache,
                                                  kv_heads, hk, d, d8, STRIDE, tid);
            cp_async_commit();
            cp_async_wait_one();
        } else {
            cp_async_wait_all();
        }
        __syncthreads();
#endif
        const bf16_t* Kb = Ks + buf * MMA_TILE_N * STRIDE;
        const bf16_t* Vb = Vs + buf * MMA_TILE_N * STRIDE;

        // ---- S = Q K^T: 16 rows x 64 keys per warp, 8 n-tiles of 8 keys
        float s[8][4];
#pragma unroll
        for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < DK; ++kk) {
            unsigned a[4];
            ldmatrix_x4(a, Qs + (warp * 16 + (lane & 15)) * STRIDE + kk * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int nn = 0; nn < 4; ++nn) {
                unsigned kb[4];
                ldmatrix_x4(kb, Kb + (nn * 16 + (lane & 7) + ((lane >> 4) << 3)) * STRIDE + kk * 16 + ((lane >> 3) & 1) * 8);
                mma_16816(s[2 * nn], a[0], a[1], a[2], a[3], kb[0], kb[1]);
                mma_16816(s[2 * nn + 1], a[0], a[1], a[2], a[3], kb[2], kb[3]);
            }
        }

        // ---- masks and the online softmax of rows r0 (s[.][0..1]) and r1 (s[.][2..3])
        const int t0 = tile_lo + it * MMA_TILE_N;
        float mx0, mx1;
        mask_scores<8>(s, t0, qd, masks, scale2, mx0, mx1);
        const float mn0 = fmaxf(m0, quad_max(mx0)), mn1 = fmaxf(m1, quad_max(mx1));
        const float alpha0 = mn0 == NEG_INF ? 1.0f : exp2f(m0 - mn0);  // m = -inf: exp2f(-inf) = 0
        const float alpha1 = mn1 == NEG_INF ? 1.0f : exp2f(m1 - mn1);
        const float base0 = mn0 == NEG_INF ? 0.0f : mn0, base1 = mn1 == NEG_INF ? 0.0f : mn1;
        m0 = mn0;
        m1 = mn1;
        unsigned pa[8][2];
        float sum0, sum1;
        exp2_pack<8>(s, base0, base1, pa, sum0, sum1);
        l0 = l0 * alpha0 + sum0;
        l1 = l1 * alpha1 + sum1;
#pragma unroll
        for (int n = 0; n < 2 * DK; ++n) {
            o[n][0] *= alpha0;
            o[n][1] *= alpha0;
            o[n][2] *= alpha1;
            o[n][3] *= alpha1;
        }

        // ---- O += P V: 4 k-steps of 16 keys, 2 * DK n-tiles of 8 dims
#pragma unroll
        for (int kk = 0; kk < MMA_TILE_N / 16; ++kk) {
            const unsigned a0 = pa[2 * kk][0], a1 = pa[2 * kk][1], a2 = pa[2 * kk + 1][0], a3 = pa[2 * kk + 1][1];
#pragma unroll
            for (int nd = 0; nd < DK; ++nd) {
                unsigned vb[4];
                ldmatrix_x4_trans(vb, Vb + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * STRIDE + nd * 16 + (lane >> 4) * 8);
                mma_16816(o[2 * nd], a0, a1, a2, a3, vb[0], vb[1]);
                mma_16816(o[2 * nd + 1], a0, a1, a2, a3, vb[2], vb[3]);
            }
        }
        __syncthreads();  // every warp is done with this buffer before it is refilled
    }
    cp_async_wait_all();  // without key tiles, nothing waited for the query rows' copies (load_q_rows)

    const float L0 = quad_sum(l0), L1 = quad_sum(l1);
    // v_scale: 1 for bf16 caches (the same bits as 1 / L), the layer's value scale for fp8 ones
    const float inv0 = L0 > 0.0f ? v_scale / L0 : 0.0f, inv1 = L1 > 0.0f ? v_scale / L1 : 0.0f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = half ? r1 : r0;
        if (r >= rows) continue;
        const float inv = half ? inv1 : inv0;
        const long long t = q_begin + tile_tok + r / group;
        bf16_t* dst = out + t * o_s0 + (long long)(hk * group + r % group) * o_s1;
#pragma unroll
        for (int n = 0; n < 2 * DK; ++n) {
            const int col = n * 8 + 2 * qd;
            if (col < d) dst[col] = float_to_bf16(o[n][2 * half] * inv);
            if (col + 1 < d) dst[col + 1] = float_to_bf16(o[n][2 * half + 1] * inv);
        }
    }
}

#define ATTENTION_MMA_KERNEL(DK)                                                                                      \
    extern "C" __global__ void __launch_bounds__(MMA_THREADS) attention_mma_d##DK(                                     \
        const bf16_t* __restrict__ q, long long q_s0, long long q_s1, const kv_t* __restrict__ k_cache,               \
        const kv_t* __restrict__ v_cache, const int* __restrict__ query_start, const int* __restrict__ seq_lens,      \
        const int* __restrict__ block_tables, int table_width, const int4* __restrict__ work,                         \
        bf16_t* __restrict__ out, long long o_s0, long long o_s1, int q_heads, int kv_heads, int d, int block_size,   \
        float scale, float v_scale, int window, int q_vec, const int* __restrict__ visible_end) { await_inputs();     \
        attention_mma_body<DK>(q, q_s0, q_s1, k_cache, v_cache, query_start, seq_lens, block_tables, table_width,      \
                               work, out, o_s0, o_s1, q_heads, kv_heads, d, block_size, scale, v_scale, window,      \
                               q_vec, visible_end);                                                                   \
    }

ATTENTION_MMA_KERNEL(2)
ATTENTION_MMA_KERNEL(4)
ATTENTION_MMA_KERNEL(5)
ATTENTION_MMA_KERNEL(6)
ATTENTION_MMA_KERNEL(8)
ATTENTION_MMA_KERNEL(16)  // 256-wide heads: 167 KiB of shared memory (Hopper; GB10 keeps attention.cu)
