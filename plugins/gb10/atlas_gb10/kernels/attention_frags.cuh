// The per-row work of the tensor-core prefill attention kernels (attention_mma.cu on mma.sync, attention_wgmma.cu
// on wgmma), whose score and output accumulators share one layout: a lane holds rows r0 (elements 0, 1 of each
// 8-column n-tile) and r0 + 8 (elements 2, 3), columns 8 n + 2 qd and + 1 (qd = lane % 4), each row spread over the
// 4 lanes of a quad. Masks, the online softmax of a key tile, and the output rows.
#pragma once
#include "mma_frags.cuh"

// The earliest last key (x) and the latest position (y) over the rows that exist among this warp's ATOMS 16-row
// blocks from first_row (lane rows first_row + 16 a + lane / 4, + 8): a tile from the item's key_start on that ends
// by x and starts inside the window of y needs no masks. Warp-uniform.
template <int ATOMS>
__device__ __forceinline__ int2 warp_key_bounds(const int* qpos, const int* qlast, int first_row, int lane) {
    int last = 0x7fffffff, pos = -1;
#pragma unroll
    for (int a = 0; a < ATOMS; ++a)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int r = first_row + 16 * a + (lane >> 2) + 8 * half;
            if (qlast[r] >= 0) {
                last = min(last, qlast[r]);
                pos = max(pos, qpos[r]);
            }
        }
    return make_int2(__reduce_min_sync(0xffffffffu, last), __reduce_max_sync(0xffffffffu, pos));
}

// One key tile of the online softmax for a lane's rows ra and ra + 8: masks the scores s of keys t0 + 8 n + 2 qd + e
// (unless `interior`: every score seen), moves the rows' running max (m, log2 units) and sum (l), rescales the
// output o when a max moved, and returns P = exp2(s scale2 - m) as bf16 A fragments (pa, `exp2_pack`).
template <int N, int NO>
__device__ __forceinline__ void softmax_tile(float (&s)[N][4], float (&o)[NO][4], float& m0, float& m1, float& l0,
                                             float& l1, unsigned (&pa)[N][2], bool interior, const int* qpos,
                                             const int* qlast, int ra, int key_start, int window, int t0, int qd,
                                             float scale2) {
    float mx0, mx1;
    if (interior) {
        row_maxima<N>(s, mx0, mx1);
    } else {  // the rows' masks from shared memory: fewer registers held across tiles
        const RowMasks masks{key_start, qlast[ra], qlast[ra + 8], qpos[ra], qpos[ra + 8], window};
        mask_scores<N>(s, t0, qd, masks, mx0, mx1);
    }
    const float mn0 = fmaxf(m0, quad_max(mx0) * scale2), mn1 = fmaxf(m1, quad_max(mx1) * scale2);
    const float alpha0 = mn0 == NEG_INF ? 1.0f : exp2f(m0 - mn0);  // m = -inf: exp2f(-inf) = 0
    const float alpha1 = mn1 == NEG_INF ? 1.0f : exp2f(m1 - mn1);
    const float base0 = mn0 == NEG_INF ? 0.0f : mn0, base1 = mn1 == NEG_INF ? 0.0f : mn1;
    m0 = mn0;
    m1 = mn1;
    float sum0, sum1;
    exp2_pack<N>(s, scale2, base0, base1, pa, sum0, sum1);
    l0 = l0 * alpha0 + sum0;
    l1 = l1 * alpha1 + sum1;
    if (__any_sync(0xffffffffu, alpha0 != 1.0f || alpha1 != 1.0f)) {  // a product by 1 changes no bits
#pragma unroll
        for (int n = 0; n < NO; ++n) {
            o[n][0] *= alpha0;
            o[n][1] *= alpha0;
            o[n][2] *= alpha1;
            o[n][3] *= alpha1;
        }
    }
}

// A lane's output rows r0 and r0 + 8 of a work item (those below `rows`): o / l (times v_scale: 1 for bf16 caches,
// the layer's value scale for fp8 ones) as bf16, columns below d, at query token first_token + r / group, head
// hk * group + r % group.
template <int NO>
__device__ __forceinline__ void store_rows(const float (&o)[NO][4], float l0, float l1, int r0, int rows, int qd,
                                           float v_scale, bf16_t* __restrict__ out, long long o_s0, long long o_s1,
                                           long long first_token, int hk, int group, int d) {
    const float L0 = quad_sum(l0), L1 = quad_sum(l1);
    const float inv0 = L0 > 0.0f ? v_scale / L0 : 0.0f, inv1 = L1 > 0.0f ? v_scale / L1 : 0.0f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = r0 + 8 * half;
        if (r >= rows) continue;
        const float inv = half ? inv1 : inv0;
        bf16_t* dst = out + (first_token + r / group) * o_s0 + (long long)(hk * group + r % group) * o_s1;
#pragma unroll
        for (int n = 0; n < NO; ++n) {
            const int col = n * 8 + 2 * qd;
            if (col < d) dst[col] = float_to_bf16(o[n][2 * half] * inv);
            if (col + 1 < d) dst[col + 1] = float_to_bf16(o[n][2 * half + 1] * inv);
        }
    }
}
