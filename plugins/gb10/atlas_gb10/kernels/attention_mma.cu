// Prefill attention on the tensor cores: FlashAttention-2's loop over key tiles with mma.sync.m16n8k16 (bf16
// in, fp32 accumulation; sm_80 and later, Hopper and GB10 alike) for the 64- or 128-row work items of an eager
// forward in direct mode (head dims up to 256; 128-row items up to 128). A block takes one item (sequence b, query tokens tile_tok ..) for one KV head; its rows are
// (query token, query head of the GQA group) pairs as in attention.cu, and so are the masks (causal or
// `visible_end`, sliding window) and the paged key/value tiles, streamed through shared memory with cp.async,
// double-buffered. Each of the 4 warps owns 16 or 32 rows: S = Q K^T for 64 keys, the online softmax in registers
// (each row's statistics shared by the 4 lanes that hold it), then O += P V with P rounded to bf16. With 32 rows
// a warp reads each key and value fragment from shared memory once for both of its 16-row blocks, half the reads
// a row of 16-row warps, which bound those.
//
// A row's result depends on that row and its keys only (key tiles aligned to key 0, processed in order), so a
// token gets the same bits whatever else its tile or batch holds; the arithmetic differs from attention.cu's
// (tensor-core dot products, P in bf16), which is why the batch-invariant mode does not use this kernel.
#include "attention_frags.cuh"
#include "gemm_core.cuh"
#include "paged_kv.cuh"

#define MMA_TILE_N 64
#define MMA_THREADS 128

// DK: the head dim padded to 16 * DK (columns past d are zeros in Q, K and V). ATOMS: 16-row blocks of rows a warp
// owns (1: 64-row items; 2: 128-row items, where each K and V fragment read from shared memory serves two).
template <int DK, int ATOMS>
__device__ __forceinline__ void attention_mma_body(
    const bf16_t* __restrict__ q, long long q_s0, long long q_s1, const kv_t* __restrict__ k_cache,
    const kv_t* __restrict__ v_cache, const int* __restrict__ query_start, const int* __restrict__ seq_lens,
    const int* __restrict__ block_tables, int table_width, const int4* __restrict__ work, bf16_t* __restrict__ out,
    long long o_s0, long long o_s1, int q_heads, int kv_heads, int d, int block_size, float scale, float v_scale,
    int window, int q_vec, const int* __restrict__ visible_end) {
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int D_PAD = 16 * DK;
    constexpr int STRIDE = D_PAD + 8;  // padded rows: conflict-free ldmatrix
    constexpr int ROWS = 64 * ATOMS;
    long long* kslot = reinterpret_cast<long long*>(smem);  // [2][MMA_TILE_N], one per buffer
    bf16_t* Qs = reinterpret_cast<bf16_t*>(kslot + 2 * MMA_TILE_N);
    bf16_t* Ks = Qs + ROWS * STRIDE;  // [2][MMA_TILE_N][STRIDE]
    bf16_t* Vs = Ks + 2 * MMA_TILE_N * STRIDE;
    int* qpos = reinterpret_cast<int*>(Vs + 2 * MMA_TILE_N * STRIDE);
    int* qlast = qpos + ROWS;
#if KV_FP8
    // FP8 caches compute from buffer 0 only; buffer 1's key rows hold the next tile's bytes, key rows then value
    // rows of STRIDE bytes (`load_kv_tile`), which `unstage_kv_tile` turns into buffer 0's bf16 rows
    kv_t* Kst = reinterpret_cast<kv_t*>(Ks + MMA_TILE_N * STRIDE);
    kv_t* Vst = Kst + MMA_TILE_N * STRIDE;
#endif

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const BlockWork bw = block_work(work, query_start, seq_lens, block_tables, table_width, q_heads, kv_heads, ROWS,
                                    window, visible_end);
    const WorkRows& w = bw.w;
    const int q_begin = w.q_begin, tile_tok = w.tile_tok, rows = w.rows, key_start = w.key_start, key_end = w.key_end;
    const int hk = bw.hk, group = bw.group;
    if (rows <= 0) return;
    const int* table = bw.table;
    const int d8 = (d + 7) & ~7;

    row_positions<MMA_THREADS>(qpos, qlast, w, ROWS, visible_end, tid);
    load_q_rows<MMA_THREADS>(Qs, STRIDE, q, q_s0, q_s1, q_begin + tile_tok, ROWS, rows, group, hk, d, D_PAD / 8, q_vec,
                             tid);
    if (d8 < D_PAD) zero_tile_columns<MMA_THREADS>(Ks, Vs, RowStride{STRIDE}, 2 * MMA_TILE_N, d8, D_PAD, tid);
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
    // atom a holds this lane's rows r0(a) (fragment elements 0, 1) and r0(a) + 8 (elements 2, 3)
    auto r0 = [&](int a) { return (warp * ATOMS + a) * 16 + g; };
    float o[ATOMS][2 * DK][4], m0[ATOMS], m1[ATOMS], l0[ATOMS], l1[ATOMS];
#pragma unroll
    for (int a = 0; a < ATOMS; ++a) {
        m0[a] = m1[a] = NEG_INF;
        l0[a] = l1[a] = 0.0f;
#pragma unroll
        for (int n = 0; n < 2 * DK; ++n) o[a][n][0] = o[a][n][1] = o[a][n][2] = o[a][n][3] = 0.0f;
    }
    const float scale2 = scale * LOG2E;  // scores in log2 units: exp2f
    const int2 bounds = warp_key_bounds<ATOMS>(qpos, qlast, warp * ATOMS * 16, lane);
    const int warp_last = bounds.x, warp_pos = bounds.y;

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

        // ---- S = Q K^T: 16 rows x 64 keys per atom, 8 n-tiles of 8 keys
        float s[ATOMS][8][4];
#pragma unroll
        for (int a = 0; a < ATOMS; ++a)
#pragma unroll
            for (int n = 0; n < 8; ++n) s[a][n][0] = s[a][n][1] = s[a][n][2] = s[a][n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < DK; ++kk) {
            unsigned qa[ATOMS][4];
#pragma unroll
            for (int a = 0; a < ATOMS; ++a)
                ldmatrix_x4(qa[a], Qs + ((warp * ATOMS + a) * 16 + (lane & 15)) * STRIDE + kk * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int nn = 0; nn < 4; ++nn) {
                unsigned kb[4];
                ldmatrix_x4(kb, Kb + (nn * 16 + (lane & 7) + ((lane >> 4) << 3)) * STRIDE + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
                for (int a = 0; a < ATOMS; ++a) {
                    mma_16816(s[a][2 * nn], qa[a][0], qa[a][1], qa[a][2], qa[a][3], kb[0], kb[1]);
                    mma_16816(s[a][2 * nn + 1], qa[a][0], qa[a][1], qa[a][2], qa[a][3], kb[2], kb[3]);
                }
            }
        }

        // ---- masks and the online softmax of each atom's rows r0 (s[a][.][0..1]) and r0 + 8 (s[a][.][2..3])
        const int t0 = tile_lo + it * MMA_TILE_N;
        const bool interior =
            t0 >= key_start && t0 + MMA_TILE_N - 1 <= warp_last && (window <= 0 || t0 > warp_pos - window);
        unsigned pa[ATOMS][8][2];
#pragma unroll
        for (int a = 0; a < ATOMS; ++a)
            softmax_tile<8, 2 * DK>(s[a], o[a], m0[a], m1[a], l0[a], l1[a], pa[a], interior, qpos, qlast, r0(a),
                                    key_start, window, t0, qd, scale2);

        // ---- O += P V: 4 k-steps of 16 keys, 2 * DK n-tiles of 8 dims
#pragma unroll
        for (int kk = 0; kk < MMA_TILE_N / 16; ++kk) {
#pragma unroll
            for (int nd = 0; nd < DK; ++nd) {
                unsigned vb[4];
                ldmatrix_x4_trans(vb, Vb + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * STRIDE + nd * 16 + (lane >> 4) * 8);
#pragma unroll
                for (int a = 0; a < ATOMS; ++a) {
                    const unsigned a0 = pa[a][2 * kk][0], a1 = pa[a][2 * kk][1];
                    const unsigned a2 = pa[a][2 * kk + 1][0], a3 = pa[a][2 * kk + 1][1];
                    mma_16816(o[a][2 * nd], a0, a1, a2, a3, vb[0], vb[1]);
                    mma_16816(o[a][2 * nd + 1], a0, a1, a2, a3, vb[2], vb[3]);
                }
            }
        }
        __syncthreads();  // every warp is done with this buffer before it is refilled
    }
    cp_async_wait_all();  // without key tiles, nothing waited for the query rows' copies (load_q_rows)

    // v_scale: 1 for bf16 caches (the same bits as 1 / L), the layer's value scale for fp8 ones
#pragma unroll
    for (int a = 0; a < ATOMS; ++a)
        store_rows<2 * DK>(o[a], l0[a], l1[a], r0(a), rows, qd, v_scale, out, o_s0, o_s1, q_begin + tile_tok, hk, group,
                           d);
}

// attention_mma_d{DK}: 64-row items; attention_mma_d{DK}_x2: 128-row items (heads up to 128 wide).
#define ATTENTION_MMA_KERNEL(NAME, DK, ATOMS)                                                                         \
    extern "C" __global__ void __launch_bounds__(MMA_THREADS) NAME(                                                    \
        const bf16_t* __restrict__ q, long long q_s0, long long q_s1, const kv_t* __restrict__ k_cache,               \
        const kv_t* __restrict__ v_cache, const int* __restrict__ query_start, const int* __restrict__ seq_lens,      \
        const int* __restrict__ block_tables, int table_width, const int4* __restrict__ work,                         \
        bf16_t* __restrict__ out, long long o_s0, long long o_s1, int q_heads, int kv_heads, int d, int block_size,   \
        float scale, float v_scale, int window, int q_vec, const int* __restrict__ visible_end) { await_inputs();     \
        attention_mma_body<DK, ATOMS>(q, q_s0, q_s1, k_cache, v_cache, query_start, seq_lens, block_tables,           \
                                      table_width, work, out, o_s0, o_s1, q_heads, kv_heads, d, block_size, scale,     \
                                      v_scale, window, q_vec, visible_end);                                           \
    }

ATTENTION_MMA_KERNEL(attention_mma_d2, 2, 1)
ATTENTION_MMA_KERNEL(attention_mma_d4, 4, 1)
ATTENTION_MMA_KERNEL(attention_mma_d5, 5, 1)
ATTENTION_MMA_KERNEL(attention_mma_d6, 6, 1)
ATTENTION_MMA_KERNEL(attention_mma_d8, 8, 1)
ATTENTION_MMA_KERNEL(attention_mma_d16, 16, 1)  // 256-wide heads: 167 KiB of shared memory (Hopper; GB10 keeps attention.cu)
ATTENTION_MMA_KERNEL(attention_mma_d2_x2, 2, 2)
ATTENTION_MMA_KERNEL(attention_mma_d4_x2, 4, 2)
ATTENTION_MMA_KERNEL(attention_mma_d5_x2, 5, 2)
ATTENTION_MMA_KERNEL(attention_mma_d6_x2, 6, 2)
ATTENTION_MMA_KERNEL(attention_mma_d8_x2, 8, 2)
