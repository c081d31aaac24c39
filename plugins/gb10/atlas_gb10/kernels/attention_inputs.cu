// The attention layer's inputs on bf16 activations: rotary embedding, the paged KV write (bf16 caches, or fp8 E4M3
// caches with the layer's scales: `store_kv`), and per-head q/k RMSNorm + RoPE + KV write fused in one launch.
//
// Every kernel computes each row with a fixed thread layout that depends only on the row width,
// never on the number of rows, so a row's result is bitwise the same in any batch.
#include "fp8.cuh"

// Rotate-half RoPE in place on the first 2*half dims of every head of q [T, Hq, D] and k [T, Hk, D]
// (strided views: token stride s0, head stride s1, dims contiguous). cos/sin: [max_pos, half] fp32.
extern "C" __global__ void rope_bf16(bf16_t* __restrict__ q, long long q_s0, long long q_s1, int q_heads,
                                     bf16_t* __restrict__ k, long long k_s0, long long k_s1, int k_heads,
                                     const int* __restrict__ positions, const float* __restrict__ cos_t,
                                     const float* __restrict__ sin_t, int half) {
    await_inputs();
    const long long t = blockIdx.x;
    const long long pos = positions[t];
    const float* c = cos_t + pos * half;
    const float* s = sin_t + pos * half;
    const int total = (q_heads + k_heads) * half;
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
        const int head = i / half;
        const int j = i - head * half;
        bf16_t* x = head < q_heads ? q + t * q_s0 + head * q_s1 : k + t * k_s0 + (head - q_heads) * k_s1;
        const float a = bf16_to_float(x[j]);
        const float b = bf16_to_float(x[j + half]);
        x[j] = float_to_bf16(__fsub_rn(__fmul_rn(a, c[j]), __fmul_rn(b, s[j])));
        x[j + half] = float_to_bf16(__fadd_rn(__fmul_rn(b, c[j]), __fmul_rn(a, s[j])));
    }
}

// A cache element from a value already in bf16: a bf16 cache stores it; an fp8 cache stores E4M3(x / scale),
// rounded to nearest even and saturated at ±448 (`atlas_core.backends.kv_dtypes.quantize_kv`).
__device__ __forceinline__ void store_kv(bf16_t* dst, bf16_t x, float) { *dst = x; }
__device__ __forceinline__ void store_kv(unsigned char* dst, bf16_t x, float scale) {
    *dst = float_to_e4m3(__fdiv_rn(bf16_to_float(x), scale));
}

// Store k/v [T, Hk, D] (strided views) at flat slots of caches [blocks, block_size, Hk, D]; slot -1 skips.
template <typename KV>
__device__ __forceinline__ void write_kv_body(KV* __restrict__ k_cache, KV* __restrict__ v_cache,
                                              const bf16_t* __restrict__ k, long long k_s0, long long k_s1,
                                              const bf16_t* __restrict__ v, long long v_s0, long long v_s1,
                                              const int* __restrict__ slots, int kv_heads, int d, float k_scale,
                                              float v_scale) {
    const long long t = blockIdx.x;
    const long long slot = slots[t];
    if (slot < 0) return;
    const int total = kv_heads * d;
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
        const int h = i / d;
        const int j = i - h * d;
        store_kv(k_cache + slot * total + i, k[t * k_s0 + h * k_s1 + j], k_scale);
        store_kv(v_cache + slot * total + i, v[t * v_s0 + h * v_s1 + j], v_scale);
    }
}

// write_kv_bf16 (the scales are ignored) and write_kv_fp8.
#define WRITE_KV_KERNEL(NAME, KV)                                                                                  \
    extern "C" __global__ void NAME(KV* __restrict__ k_cache, KV* __restrict__ v_cache, const bf16_t* __restrict__ k, \
                                    long long k_s0, long long k_s1, const bf16_t* __restrict__ v, long long v_s0,    \
                                    long long v_s1, const int* __restrict__ slots, int kv_heads, int d,             \
                                    float k_scale, float v_scale) { await_inputs();                                 \
        write_kv_body(k_cache, v_cache, k, k_s0, k_s1, v, v_s0, v_s1, slots, kv_heads, d, k_scale, v_scale);         \
    }

WRITE_KV_KERNEL(write_kv_bf16, bf16_t)
WRITE_KV_KERNEL(write_kv_fp8, unsigned char)

// The attention layer's inputs in one launch: per-head RMSNorm of q and k (a null weight skips it),
// rotate-half RoPE on the first 2*half dims, then q into q_out [T, Hq, D] (contiguous) and k, v into
// the caches at slots[t] (-1: k and v are skipped, q is still written; `store_kv` with the layer's scales for
// fp8 caches). Heads are numbered q heads, then k heads, then v heads; QKR_WARPS warps a block, grid (tokens,
// ceil(heads / (QKR_WARPS x heads a warp))), so that a decode step's heads run on several SMs at once. The kernels
// of one all-rotated head width take QKR_BATCH heads a warp (heads w, w + stride, ...) with every read issued
// before any arithmetic, in registers: the kernel is bound by the latency of its reads, and a warp per head kept
// too few in flight. The general kernel takes a head a warp, staged in shared memory as floats. Each value is
// rounded to bf16 where the separate ops (rms_norm, rope, write_kv) round it.
#define QKR_WARPS 4
#define QKR_MAX_D 256
#define QKR_BATCH 4

// One q or k head of qk_norm_rope_write_kv_body whose width d = 32 E is all rotated (2 half == d, E even), its
// elements already loaded: lane l holds elements l + 32 m (x[m]), so each rotated pair (m, m + E / 2) sits in one
// lane's registers; w: the norm's weights at the same elements (read when `normed`), cs / ss: the rotation's
// cosines and sines of elements l + 32 m, m < E / 2. The same arithmetic, in the same order, as the general path.
template <int E, typename Put>
__device__ __forceinline__ void norm_rope_head(float (&x)[E], bool normed, const float (&w)[E], float eps,
                                               const float (&cs)[E / 2], const float (&ss)[E / 2], int lane, Put put) {
    if (normed) {
        float sq = 0.0f;
#pragma unroll
        for (int m = 0; m < E; ++m) sq = __fmaf_rn(x[m], x[m], sq);
        const float inv = 1.0f / sqrtf(__fadd_rn(__fdiv_rn(__shfl_sync(0xffffffffu, warp_sum(sq), 0), (float)(32 * E)), eps));
#pragma unroll
        for (int m = 0; m < E; ++m) x[m] = bf16_to_float(float_to_bf16(__fmul_rn(__fmul_rn(x[m], inv), w[m])));
    }
#pragma unroll
    for (int m = 0; m < E / 2; ++m) {
        const int j = lane + 32 * m;
        const float a = x[m], b = x[m + E / 2];
        put(j, float_to_bf16(__fsub_rn(__fmul_rn(a, cs[m]), __fmul_rn(b, ss[m]))));
        put(j + 16 * E, float_to_bf16(__fadd_rn(__fmul_rn(b, cs[m]), __fmul_rn(a, ss[m]))));
    }
}

// Up to QKR_BATCH heads of one token whose width d = 32 E is all rotated, by one warp: every global read of the
// batch (the heads' elements, both norms' weights, the rotation's row) is issued before any arithmetic, so the
// heads share one memory round trip. heads[i] < 0: no head. `Head` resolves a head to (source row, kind).
template <int E, typename KV>
__device__ __forceinline__ void rotated_heads(const int (&heads)[QKR_BATCH], const bf16_t* __restrict__ q, long long q_s0,
                                              long long q_s1, int q_heads, const bf16_t* __restrict__ k, long long k_s0,
                                              long long k_s1, const bf16_t* __restrict__ v, long long v_s0,
                                              long long v_s1, int kv_heads, const bf16_t* __restrict__ q_weight,
                                              const bf16_t* __restrict__ k_weight, float eps, const float* __restrict__ c,
                                              const float* __restrict__ s, bf16_t* __restrict__ q_out,
                                              KV* __restrict__ k_cache, KV* __restrict__ v_cache, long long t,
                                              long long slot, float k_scale, float v_scale, int lane) {
    constexpr int D = 32 * E;
    const long long kv_row = (long long)kv_heads * D;
    float x[QKR_BATCH][E], wq[E], wk[E], cs[E / 2], ss[E / 2];
#pragma unroll
    for (int i = 0; i < QKR_BATCH; ++i) {
        const int h = heads[i];
        if (h < 0) continue;
        const bf16_t* src = h < q_heads ? q + t * q_s0 + h * q_s1
                            : h < q_heads + kv_heads ? k + t * k_s0 + (h - q_heads) * k_s1
                                                     : v + t * v_s0 + (h - q_heads - kv_heads) * v_s1;
#pragma unroll
        for (int m = 0; m < E; ++m) x[i][m] = bf16_to_float(src[lane + 32 * m]);
    }
#pragma unroll
    for (int m = 0; m < E; ++m) {
        wq[m] = q_weight ? bf16_to_float(q_weight[lane + 32 * m]) : 0.0f;
        wk[m] = k_weight ? bf16_to_float(k_weight[lane + 32 * m]) : 0.0f;
    }
#pragma unroll
    for (int m = 0; m < E / 2; ++m) {
        cs[m] = c[lane + 32 * m];
        ss[m] = s[lane + 32 * m];
    }
#pragma unroll
    for (int i = 0; i < QKR_BATCH; ++i) {
        const int h = heads[i];
        if (h < 0) continue;
        if (h >= q_heads + kv_heads) {  // a value head: its elements' bf16 bits (the float's high half) into the cache
            KV* dst = v_cache + slot * kv_row + (long long)(h - q_heads - kv_heads) * D;
#pragma unroll
            for (int m = 0; m < E; ++m)
                store_kv(dst + lane + 32 * m, (bf16_t)(__float_as_uint(x[i][m]) >> 16), v_scale);
        } else if (h < q_heads) {
            bf16_t* dst = q_out + (t * q_heads + h) * D;
            norm_rope_head<E>(x[i], q_weight != nullptr, wq, eps, cs, ss, lane, [&](int j, bf16_t y) { dst[j] = y; });
        } else {
            KV* dst = k_cache + slot * kv_row + (long long)(h - q_heads) * D;
            norm_rope_head<E>(x[i], k_weight != nullptr, wk, eps, cs, ss, lane,
                              [&](int j, bf16_t y) { store_kv(dst + j, y, k_scale); });
        }
    }
}

// E > 0: heads of d = 32 E all rotated (rotated_heads); E = 0: any head (the general path, staged in shared memory).
template <int E, typename KV>
__device__ __forceinline__ void qk_norm_rope_write_kv_body(
    const bf16_t* __restrict__ q, long long q_s0, long long q_s1, int q_heads, const bf16_t* __restrict__ k,
    long long k_s0, long long k_s1, const bf16_t* __restrict__ v, long long v_s0, long long v_s1, int kv_heads,
    const bf16_t* __restrict__ q_weight, const bf16_t* __restrict__ k_weight, float eps,
    const int* __restrict__ positions, const float* __restrict__ cos_t, const float* __restrict__ sin_t, int half,
    bf16_t* __restrict__ q_out, KV* __restrict__ k_cache, KV* __restrict__ v_cache, const int* __restrict__ slots,
    int d, float k_scale, float v_scale) {
    __shared__ float stage[QKR_WARPS][QKR_MAX_D];
    const long long t = blockIdx.x;
    const long long slot = slots[t];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const long long kv_row = (long long)kv_heads * d;
    const float* c = cos_t + (long long)positions[t] * half;
    const float* s = sin_t + (long long)positions[t] * half;
    float* buf = stage[warp];
    constexpr int BATCH = E > 0 ? QKR_BATCH : 1;  // heads a warp takes at once
    const int heads = q_heads + 2 * kv_heads, stride = gridDim.y * warps;
    for (int first = blockIdx.y * warps + warp; first < heads; first += BATCH * stride) {
        // this warp's heads: first, first + stride, ... (the keys and values of a skipped token (slot -1): none)
        int batch[QKR_BATCH];
#pragma unroll
        for (int i = 0; i < QKR_BATCH; ++i) {
            const int h = first + i * stride;
            batch[i] = i < BATCH && h < heads && (h < q_heads || slot >= 0) ? h : -1;
        }
        if constexpr (E > 0) {
            rotated_heads<E>(batch, q, q_s0, q_s1, q_heads, k, k_s0, k_s1, v, v_s0, v_s1, kv_heads, q_weight, k_weight,
                             eps, c, s, q_out, k_cache, v_cache, t, slot, k_scale, v_scale, lane);
            continue;
        }
        {
            const int h = batch[0];
            if (h < 0) continue;
            if (h >= q_heads + kv_heads) {
                const int vh = h - q_heads - kv_heads;
                const bf16_t* src = v + t * v_s0 + vh * v_s1;
                KV* dst = v_cache + slot * kv_row + (long long)vh * d;
                for (int e = lane; e < d; e += 32) store_kv(dst + e, src[e], v_scale);
                continue;
            }
            const bool is_q = h < q_heads;
            const bf16_t* src = is_q ? q + t * q_s0 + h * q_s1 : k + t * k_s0 + (h - q_heads) * k_s1;
            const bf16_t* weight = is_q ? q_weight : k_weight;
            bf16_t* q_dst = q_out + (t * q_heads + h) * d;
            KV* k_dst = k_cache + slot * kv_row + (long long)(h - q_heads) * d;
            const auto put = [&](int e, bf16_t y) {
                if (is_q)
                    q_dst[e] = y;
                else
                    store_kv(k_dst + e, y, k_scale);
            };
            // every global read of the head first (one memory round trip), then the arithmetic
            constexpr int PER_LANE = QKR_MAX_D / 32;
            float xs[PER_LANE], ws[PER_LANE], cs[PER_LANE / 2], ss[PER_LANE / 2];
#pragma unroll
            for (int m = 0; m < PER_LANE; ++m) {
                const int e = lane + 32 * m;
                xs[m] = e < d ? bf16_to_float(src[e]) : 0.0f;
                ws[m] = weight && e < d ? bf16_to_float(weight[e]) : 0.0f;
            }
#pragma unroll
            for (int m = 0; m < PER_LANE / 2; ++m) {
                const int j = lane + 32 * m;
                cs[m] = j < half ? c[j] : 0.0f;
                ss[m] = j < half ? s[j] : 0.0f;
            }
            float sq = 0.0f;
#pragma unroll
            for (int m = 0; m < PER_LANE; ++m) sq = __fmaf_rn(xs[m], xs[m], sq);  // zeros past d add nothing
            const float inv =
                1.0f / sqrtf(__fadd_rn(__fdiv_rn(__shfl_sync(0xffffffffu, warp_sum(sq), 0), (float)d), eps));
#pragma unroll
            for (int m = 0; m < PER_LANE; ++m) {
                const int e = lane + 32 * m;
                if (e < d)
                    buf[e] = weight ? bf16_to_float(float_to_bf16(__fmul_rn(__fmul_rn(xs[m], inv), ws[m]))) : xs[m];
            }
            __syncwarp();
#pragma unroll
            for (int m = 0; m < PER_LANE / 2; ++m) {
                const int j = lane + 32 * m;
                if (j < half) {
                    const float a = buf[j], b = buf[j + half];
                    put(j, float_to_bf16(__fsub_rn(__fmul_rn(a, cs[m]), __fmul_rn(b, ss[m]))));
                    put(j + half, float_to_bf16(__fadd_rn(__fmul_rn(b, cs[m]), __fmul_rn(a, ss[m]))));
                }
            }
            for (int e = 2 * half + lane; e < d; e += 32) put(e, float_to_bf16(buf[e]));
            __syncwarp();
        }
    }
}

// qk_norm_rope_write_kv_bf16 (the scales are ignored) and qk_norm_rope_write_kv_fp8: any head; the _d64, _d128 and
// _d256 kernels: heads of that width, all rotated (fewer registers than one kernel for every width would hold).
#define QK_NORM_ROPE_WRITE_KV_KERNEL(NAME, E, KV)                                                                    \
    extern "C" __global__ void __launch_bounds__(QKR_WARPS * 32) NAME(                                               \
        const bf16_t* __restrict__ q, long long q_s0, long long q_s1, int q_heads, const bf16_t* __restrict__ k,     \
        long long k_s0, long long k_s1, const bf16_t* __restrict__ v, long long v_s0, long long v_s1, int kv_heads,  \
        const bf16_t* __restrict__ q_weight, const bf16_t* __restrict__ k_weight, float eps,                         \
        const int* __restrict__ positions, const float* __restrict__ cos_t, const float* __restrict__ sin_t,         \
        int half, bf16_t* __restrict__ q_out, KV* __restrict__ k_cache, KV* __restrict__ v_cache,                    \
        const int* __restrict__ slots, int d, float k_scale, float v_scale) {                                        \
        prefetch_l2(q_weight, 2LL * d, threadIdx.x, blockDim.x);                                                     \
        prefetch_l2(k_weight, 2LL * d, threadIdx.x, blockDim.x);                                                     \
        await_inputs();                                                                                              \
        qk_norm_rope_write_kv_body<E>(q, q_s0, q_s1, q_heads, k, k_s0, k_s1, v, v_s0, v_s1, kv_heads, q_weight,      \
                                      k_weight, eps, positions, cos_t, sin_t, half, q_out, k_cache, v_cache, slots,  \
                                      d, k_scale, v_scale);                                                          \
    }
#define QK_NORM_ROPE_WRITE_KV_KERNELS(KV, SUFFIX)                                            \
    QK_NORM_ROPE_WRITE_KV_KERNEL(qk_norm_rope_write_kv_##SUFFIX, 0, KV)                      \
    QK_NORM_ROPE_WRITE_KV_KERNEL(qk_norm_rope_write_kv_d64_##SUFFIX, 2, KV)                  \
    QK_NORM_ROPE_WRITE_KV_KERNEL(qk_norm_rope_write_kv_d128_##SUFFIX, 4, KV)                 \
    QK_NORM_ROPE_WRITE_KV_KERNEL(qk_norm_rope_write_kv_d256_##SUFFIX, 8, KV)

QK_NORM_ROPE_WRITE_KV_KERNELS(bf16_t, bf16)
QK_NORM_ROPE_WRITE_KV_KERNELS(unsigned char, fp8)
