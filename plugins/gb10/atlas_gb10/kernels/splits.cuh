// Split-K ("flash-decoding") pieces shared by the attention kernels (attention.cu, mla.cu): merging the
// (max, sum, accumulator) partials of key splits in split order with explicit roundings, the combine
// kernel body that merges them from a workspace, a row's online-softmax step over one key tile, and the
// cp.async copies that stream key tiles into shared memory.
//
// A row's attention is canonically: an online softmax over each split of its keys (splits aligned to
// key 0), the splits then merged in order by `merge_factors` / `merge_value`. A kernel that merges its
// splits itself (direct mode) and `combine_splits` over a workspace give the same bits.
#pragma once
#include "common.cuh"

// A row's output element from its merged accumulator o and sum L, times the value scale (1 for bf16 caches,
// where the product is exact; fp8 caches' layer scale), in bf16.
__device__ __forceinline__ bf16_t normalized_output(float o, float L, float v_scale) {
    return float_to_bf16(L > 0.0f ? __fmul_rn(__fdiv_rn(o, L), v_scale) : 0.0f);
}

// Fold one split's (m, l, acc) into the running (M, L, O). Empty splits (m = -inf) must be skipped by
// the caller. Explicit roundings: the same bits wherever it is inlined.
__device__ __forceinline__ void merge_factors(float M, float m, float* a, float* b, float* M_new) {
    const float mn = fmaxf(M, m);
    *a = (M == NEG_INF) ? 0.0f : expf(__fsub_rn(M, mn));
    *b = expf(__fsub_rn(m, mn));
    *M_new = mn;
}

__device__ __forceinline__ float merge_value(float running, float a, float value, float b) {
    return __fadd_rn(__fmul_rn(running, a), __fmul_rn(value, b));
}

// One row's online-softmax step over a tile of TILE_N scores (-inf: masked), by one warp: lane l takes keys
// l, l + 32, ... in order, then a fixed shuffle tree, so the row's statistics are the same bits in every
// block shape. p = exp(score - new max) goes to `store(c, p)`, which returns the value to add to the row
// sum (a caller that rounds p sums what it rounded); lane 0 updates the split's (m, l) and writes the
// factor alpha for the row's accumulator. A tile masked for the whole row stores zeros, alpha = 1.
template <int TILE_N, typename Store>
__device__ __forceinline__ void softmax_tile_row(const float* scores, float* m_split, float* l_split, float* alpha,
                                                 int lane, Store store) {
    float mt = NEG_INF;
    for (int c = lane; c < TILE_N; c += 32) mt = fmaxf(mt, scores[c]);
    mt = warp_max(mt);
    if (mt == NEG_INF) {  // every key of this tile is masked for this row: state unchanged
        for (int c = lane; c < TILE_N; c += 32) store(c, 0.0f);
        if (lane == 0) *alpha = 1.0f;
        return;
    }
    const float m_old = *m_split;
    const float m_new = fmaxf(m_old, mt);
    const float a = (m_old == NEG_INF) ? 0.0f : expf(__fsub_rn(m_old, m_new));
    float sum = 0.0f;
    for (int c = lane; c < TILE_N; c += 32) sum = __fadd_rn(sum, store(c, expf(__fsub_rn(scores[c], m_new))));
    sum = __shfl_sync(0xffffffffu, warp_sum(sum), 0);
    __syncwarp();
    if (lane == 0) {
        *l_split = __fadd_rn(__fmul_rn(*l_split, a), sum);
        *m_split = m_new;
        *alpha = a;
    }
}

__device__ __forceinline__ void cp_async16(void* smem_dst, const void* global_src) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global_src));
}

__device__ __forceinline__ void cp_async8(void* smem_dst, const void* global_src) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(global_src));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// Merge the split partials of every (token, head) row in split order and write the output: row =
// t * q_heads + h, its split s at ws_ml[row * splits + s] (max, sum) and ws_acc[(row * splits + s) * d ..].
// One warp per row; head dims up to 32 * MAX_DPT. The lanes read the (max, sum) of 32 splits at once and
// share them by shuffles, so empty splits (past a context, m = -inf) cost no memory round trip, and the
// accumulators of COMBINE_BATCH splits with keys are read together; each lane merges its dims in split order
// (the same bits as a kernel's direct mode), then scales by v_scale.
#define COMBINE_BATCH 4
template <int MAX_DPT>
__device__ __forceinline__ void combine_splits(const float* __restrict__ ws_acc, const float2* __restrict__ ws_ml,
                                               int splits, bf16_t* __restrict__ out, long long o_s0, long long o_s1,
                                               int q_heads, int d, long long rows, float v_scale) {
    const long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= rows) return;
    const int lane = threadIdx.x & 31;
    const long long t = row / q_heads;
    const int h = (int)(row - t * q_heads);
    float O[MAX_DPT];
#pragma unroll
    for (int i = 0; i < MAX_DPT; ++i) O[i] = 0.0f;
    float M = NEG_INF, L = 0.0f;
    for (int s0 = 0; s0 < splits; s0 += 32) {
        float2 mine;
        mine.x = NEG_INF;
        mine.y = 0.0f;
        if (s0 + lane < splits) mine = ws_ml[row * splits + s0 + lane];
        unsigned live = __ballot_sync(0xffffffffu, mine.x != NEG_INF);  // splits with keys: the same in every lane
        while (live) {  // COMBINE_BATCH live splits' accumulators in flight at once, then merged in split order
            int ks[COMBINE_BATCH];
            float values[COMBINE_BATCH][MAX_DPT];
#pragma unroll
            for (int n = 0; n < COMBINE_BATCH; ++n) {
                ks[n] = live ? __ffs(live) - 1 : -1;
                live &= live - 1u;
                const float* acc = ws_acc + (row * splits + s0 + max(ks[n], 0)) * d;
#pragma unroll
                for (int i = 0; i < MAX_DPT; ++i) {
                    const int j = lane + 32 * i;
                    values[n][i] = ks[n] >= 0 && j < d ? acc[j] : 0.0f;
                }
            }
#pragma unroll
            for (int n = 0; n < COMBINE_BATCH; ++n) {
                if (ks[n] < 0) break;
                const float m = __shfl_sync(0xffffffffu, mine.x, ks[n]);
                const float l = __shfl_sync(0xffffffffu, mine.y, ks[n]);
                float a, b, M_new;
                merge_factors(M, m, &a, &b, &M_new);
#pragma unroll
                for (int i = 0; i < MAX_DPT; ++i)
                    if (lane + 32 * i < d) O[i] = merge_value(O[i], a, values[n][i], b);
                L = merge_value(L, a, l, b);
                M = M_new;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < MAX_DPT; ++i) {
        const int j = lane + 32 * i;
        if (j < d) out[t * o_s0 + h * o_s1 + j] = normalized_output(O[i], L, v_scale);
    }
}
