// Prefill attention on Hopper's warpgroup tensor-core instructions (wgmma, sm_90a) for heads up to 128 wide: the
// 128-row work items of attention_mma.cu's `_x2` kernels (the same work list, rows of (query token, query head of
// the GQA group), masks and paged key/value tiles), with FlashAttention's loop over key tiles of 64.
//
// A block of two warpgroups takes one item (blockIdx.y) for one KV head (blockIdx.x, so that every head's first
// items, the longest in the host's order, start first); warpgroup w owns rows 64 w .. 64 w + 63. The query
// rows and a ring of two key/value tiles sit in shared memory in the 128-byte swizzled layout wgmma reads (64
// columns a block, `Swizzled128`); every thread copies its share of the next tile (cp.async) while the current
// one is computed, one barrier a tile. Per tile, a warpgroup computes S = Q K^T (m64n64k16 from shared memory, K
// read K-major), the online softmax on S's accumulators (attention_frags.cuh: the layout of mma.sync's), then
// O += P V with P as bf16 register fragments and V read N-major (m64n128k16, imm-trans-b). A warpgroup whose rows
// see none of a tile's keys skips it.
//
// A row's result depends on that row and its keys only (key tiles aligned to key 0, processed in order), so a token
// gets the same bits whatever else its item or batch holds; not the bits of attention_mma.cu, whose products sum in
// another order.
#include "attention_frags.cuh"
#include "gemm_core.cuh"
#include "paged_kv.cuh"
#include "wgmma.cuh"

#define AW_TILE_N 64
#define AW_ROWS 128
#define AW_THREADS 256
#define AW_D 128
#define AW_Q_BYTES (AW_ROWS * AW_D * 2)
#define AW_KV_BYTES (AW_TILE_N * AW_D * 2)

// The dynamic shared memory of a block: the query rows, two key and two value tiles, two tiles' KV slots, the rows'
// positions and last keys, and the alignment slack.
extern "C" __device__ int attention_wgmma_shared_bytes[1] = {AW_Q_BYTES + 4 * AW_KV_BYTES + 2 * AW_TILE_N * 8 +
                                                             2 * AW_ROWS * 4 + 1024};

// A 128-byte swizzled bf16 tile of ROWS rows: columns in blocks of 64 (each ROWS rows of 128 bytes), row r's
// 16-byte chunk c of a block at (c ^ (r % 8)) * 16 bytes. The element offset of row r's column j.
template <int ROWS>
struct Swizzled128 {
    __device__ __forceinline__ int operator()(int r, int j) const {
        return (j >> 6) * (ROWS * 64) + r * 64 + ((((j >> 3) & 7) ^ (r & 7)) << 3) + (j & 7);
    }
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ void attention_wgmma_body(
    const bf16_t* __restrict__ q, long long q_s0, long long q_s1, const kv_t* __restrict__ k_cache,
    const kv_t* __restrict__ v_cache, const int* __restrict__ query_start, const int* __restrict__ seq_lens,
    const int* __restrict__ block_tables, int table_width, const int4* __restrict__ work, bf16_t* __restrict__ out,
    long long o_s0, long long o_s1, int q_heads, int kv_heads, int d, int block_size, float scale, int window,
    int q_vec, const int* __restrict__ visible_end) {
    extern __shared__ __align__(16) unsigned char aw_smem[];
    const unsigned raw = (unsigned)__cvta_generic_to_shared(aw_smem);
    const unsigned base = (raw + 1023u) & ~1023u;  // swizzled tiles start on 1024-byte boundaries
    unsigned char* tiles_at = aw_smem + (base - raw);
    bf16_t* Qs = reinterpret_cast<bf16_t*>(tiles_at);
    bf16_t* Ks = reinterpret_cast<bf16_t*>(tiles_at + AW_Q_BYTES);  // [2] tiles of AW_KV_BYTES
    bf16_t* Vs = reinterpret_cast<bf16_t*>(tiles_at + AW_Q_BYTES + 2 * AW_KV_BYTES);
    long long* kslot = reinterpret_cast<long long*>(tiles_at + AW_Q_BYTES + 4 * AW_KV_BYTES);  // [2][AW_TILE_N]
    int* qpos = reinterpret_cast<int*>(kslot + 2 * AW_TILE_N);
    int* qlast = qpos + AW_ROWS;
    const unsigned q_smem = base, k_smem = base + AW_Q_BYTES, v_smem = base + AW_Q_BYTES + 2 * AW_KV_BYTES;
    const Swizzled128<AW_ROWS> q_at;
    const Swizzled128<AW_TILE_N> kv_at;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const BlockWork bw = block_work(work, query_start, seq_lens, block_tables, table_width, q_heads, kv_heads, AW_ROWS,
                                    window, visible_end, blockIdx.y, blockIdx.x);
    const WorkRows& w = bw.w;
    const int rows = w.rows, key_start = w.key_start, key_end = w.key_end, hk = bw.hk, group = bw.group;
    if (rows <= 0) return;
    const int d8 = (d + 7) & ~7;

    row_positions<AW_THREADS>(qpos, qlast, w, AW_ROWS, visible_end, tid);
    load_q_rows_at<AW_THREADS>(Qs, q_at, q, q_s0, q_s1, w.q_begin + w.tile_tok, AW_ROWS, rows, group, hk, d, AW_D / 8,
                               q_vec, tid);
    if (d8 < AW_D) {  // both buffers' rows: row r of buffer r / AW_TILE_N
        const auto ring_at = [&](int r, int j) { return (r / AW_TILE_N) * (AW_KV_BYTES / 2) + kv_at(r % AW_TILE_N, j); };
        zero_tile_columns<AW_THREADS>(Ks, Vs, ring_at, 2 * AW_TILE_N, d8, AW_D, tid);
    }
    const int tile_lo = key_start / AW_TILE_N * AW_TILE_N;
    const int tiles = key_end > tile_lo ? (key_end - tile_lo + AW_TILE_N - 1) / AW_TILE_N : 0;
    for (int t = 0; t < 2 && t < tiles; ++t)
        tile_slots<AW_TILE_N, AW_THREADS>(kslot + t * AW_TILE_N, bw.table, tile_lo + t * AW_TILE_N, key_start, key_end,
                                          block_size, tid);
    __syncthreads();
    if (tiles > 0)
        load_kv_tile_at<AW_TILE_N, AW_THREADS, AW_D / 8>(Ks, Vs, kv_at, kslot, k_cache, v_cache, kv_heads, hk, d, d8, tid);
    cp_async_commit();

    const int g = lane >> 2, qd = lane & 3, r0 = warp * 16 + g;
    float o[AW_D / 8][4], m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
#pragma unroll
    for (int n = 0; n < AW_D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    const float scale2 = scale * LOG2E;  // scores in log2 units: exp2f
    const int2 bounds = warp_key_bounds<1>(qpos, qlast, warp * 16, lane);
    // This warpgroup's query rows (K-major), buffer 0's keys (K-major) and values (N-major: 8-key groups 1024
    // bytes apart, 64-column blocks a tile apart)
    const unsigned long long q_desc = tile_descriptor(q_smem + wg * 64 * 128), k_desc0 = tile_descriptor(k_smem);
    const unsigned long long v_desc0 = smem_descriptor(v_smem, AW_TILE_N * 128, 1024);
    // The warpgroup's rows that exist, their last key seen and first position (both non-decreasing along the rows)
    const int wg_first = 64 * wg, wg_rows = min(rows - wg_first, 64);
    const int wg_last = wg_rows > 0 ? qlast[wg_first + wg_rows - 1] : -1, wg_pos = wg_rows > 0 ? qpos[wg_first] : 0;

    for (int it = 0; it < tiles; ++it) {
        const int buf = it & 1;
        cp_async_wait_all();
        // this thread's shared-memory writes (copies, zeros, the first tile's query rows), which the generic proxy
        // made, ordered before the wgmma reads (async proxy) that follow the barrier
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();  // tile it has landed; every warpgroup is done with tile it - 1 and its slots
        if (it + 2 < tiles)
            tile_slots<AW_TILE_N, AW_THREADS>(kslot + buf * AW_TILE_N, bw.table, tile_lo + (it + 2) * AW_TILE_N,
                                              key_start, key_end, block_size, tid);
        if (it + 1 < tiles) {  // the next tile streams in while this one is computed
            load_kv_tile_at<AW_TILE_N, AW_THREADS, AW_D / 8>(Ks + (buf ^ 1) * (AW_KV_BYTES / 2), Vs + (buf ^ 1) * (AW_KV_BYTES / 2),
                                                   kv_at, kslot + (buf ^ 1) * AW_TILE_N, k_cache, v_cache, kv_heads,
                                                   hk, d, d8, tid);
            cp_async_commit();
        }
        const int t0 = tile_lo + it * AW_TILE_N;
        if (t0 > wg_last || (window > 0 && t0 + AW_TILE_N - 1 <= wg_pos - window)) continue;  // warpgroup-uniform

        // ---- S = Q K^T: 8 k-steps of 16 dims (4 a 64-column block of the swizzled tiles); a descriptor's low
        // bits hold the address / 16, so offsets within the tiles add to it
        const unsigned long long k_desc = k_desc0 + buf * (AW_KV_BYTES >> 4), v_desc = v_desc0 + buf * (AW_KV_BYTES >> 4);
        float s[8][4];
#pragma unroll
        for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        fence_operands(s);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < AW_D / 16; ++kk) {
            const unsigned col = (kk >> 2), in_row = (kk & 3) * 32;
            wgmma_64x64x16_ss(s, q_desc + ((col * AW_ROWS * 128 + in_row) >> 4),
                              k_desc + ((col * AW_TILE_N * 128 + in_row) >> 4), 1);
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_operands(s);

        const bool interior =
            t0 >= key_start && t0 + AW_TILE_N - 1 <= bounds.x && (window <= 0 || t0 > bounds.y - window);
        unsigned pa[8][2];
        softmax_tile<8, AW_D / 8>(s, o, m0, m1, l0, l1, pa, interior, qpos, qlast, r0, key_start, window, t0, qd,
                                  scale2);

        // ---- O += P V: 4 k-steps of 16 keys
        fence_operands(o);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < AW_TILE_N / 16; ++kk)
            wgmma_64x128x16_rs(o, pa[2 * kk][0], pa[2 * kk][1], pa[2 * kk + 1][0], pa[2 * kk + 1][1],
                               v_desc + ((kk * 16 * 128) >> 4));
        wgmma_commit();
        wgmma_wait<0>();
        fence_operands(o);
    }
    cp_async_wait_all();  // without key tiles, nothing waited for the query rows' copies (load_q_rows_at)
    store_rows<AW_D / 8>(o, l0, l1, r0, rows, qd, 1.0f, out, o_s0, o_s1, w.q_begin + w.tile_tok, hk, group, d);
}

#endif

// 128-row items of heads up to 128 wide over bf16 caches; 256 threads, attention_wgmma_shared_bytes of shared
// memory; the arguments of attention_mma.cu's kernels (v_scale unused: 1 for bf16 caches).
extern "C" __global__ void __launch_bounds__(AW_THREADS, 2) attention_wgmma_d8(
    const bf16_t* __restrict__ q, long long q_s0, long long q_s1, const kv_t* __restrict__ k_cache,
    const kv_t* __restrict__ v_cache, const int* __restrict__ query_start, const int* __restrict__ seq_lens,
    const int* __restrict__ block_tables, int table_width, const int4* __restrict__ work, bf16_t* __restrict__ out,
    long long o_s0, long long o_s1, int q_heads, int kv_heads, int d, int block_size, float scale, float v_scale,
    int window, int q_vec, const int* __restrict__ visible_end) {
    await_inputs();
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    attention_wgmma_body(q, q_s0, q_s1, k_cache, v_cache, query_start, seq_lens, block_tables, table_width, work, out,
                         o_s0, o_s1, q_heads, kv_heads, d, block_size, scale, window, q_vec, visible_end);
#else
    __trap();
#endif
}
