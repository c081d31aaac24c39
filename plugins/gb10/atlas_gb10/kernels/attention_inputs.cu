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
// fp8 caches). A warp per head (q heads, then k heads, then v heads), QKR_WARPS heads a block: grid (tokens,
// ceil(heads / QKR_WARPS)), so that a decode step's heads run on several SMs at once; a head is staged in shared
// memory as floats, each value rounded to bf16 where the separate ops (rms_norm, rope, write_kv) round it.
#define QKR_WARPS 4
#define QKR_MAX_D 256

// V consecutive bf16 (V = 1, 2, 4; the address aligned to 2 V bytes) as floats, and back.
template <int V>
__device__ __forceinline__ void load_bf16(const bf16_t* __restrict__ p, float (&x)[V]) {
    if constexpr (V == 1) {
        x[0] = bf16_to_float(*p);
    } else if constexpr (V == 2) {
        const unsigned w = *reinterpret_cast<const unsigned*>(p);
        x[0] = bf16_lo(w);
        x[1] = bf16_hi(w);
    } else {
        const uint2 w = *reinterpret_cast<const uint2*>(p);
        x[0] = bf16_lo(w.x);
        x[1] = bf16_hi(w.x);
        x[2] = bf16_lo(w.y);
        x[3] = bf16_hi(w.y);
    }
}

template <int V>
__device__ __forceinline__ void store_bf16(bf16_t* __restrict__ p, const bf16_t (&v)[V]) {
    if constexpr (V == 1) {
        *p = v[0];
    } else if constexpr (V == 2) {
        *reinterpret_cast<unsigned*>(p) = v[0] | ((unsigned)v[1] << 16);
    } else {
        *reinterpret_cast<uint2*>(p) = make_uint2(v[0] | ((unsigned)v[1] << 16), v[2] | ((unsigned)v[3] << 16));
    }
}

// V consecutive floats (the address aligned to 4 V bytes).
template <int V>
__device__ __forceinline__ void load_f32(const float* __restrict__ p, float (&x)[V]) {
    if constexpr (V == 1) {
        x[0] = *p;
    } else if constexpr (V == 2) {
        const float2 w = *reinterpret_cast<const float2*>(p);
        x[0] = w.x;
        x[1] = w.y;
    } else {
        const float4 w = *reinterpret_cast<const float4*>(p);
        x[0] = w.x;
        x[1] = w.y;
        x[2] = w.z;
        x[3] = w.w;
    }
}

// V rotated key elements into a cache: one store into a bf16 cache, `store_kv` each into an fp8 one.
template <int V>
__device__ __forceinline__ void store_kv_run(bf16_t* dst, const bf16_t (&v)[V], float) {
    store_bf16<V>(dst, v);
}
template <int V>
__device__ __forceinline__ void store_kv_run(unsigned char* dst, const bf16_t (&v)[V], float scale) {
#pragma unroll
    for (int m = 0; m < V; ++m) store_kv(dst + m, v[m], scale);
}

// A value head of d elements into a cache by one warp: 16 bytes a lane where both rows allow it (bf16 caches).
__device__ __forceinline__ void copy_value_head(bf16_t* dst, const bf16_t* __restrict__ src, int d, int lane, float) {
    if ((d & 7) == 0 && (((unsigned long long)dst | (unsigned long long)src) & 15) == 0) {
        for (int i = 8 * lane; i < d; i += 256)
            *reinterpret_cast<uint4*>(dst + i) = *reinterpret_cast<const uint4*>(src + i);
        return;
    }
    for (int i = lane; i < d; i += 32) dst[i] = src[i];
}
__device__ __forceinline__ void copy_value_head(unsigned char* dst, const bf16_t* __restrict__ src, int d, int lane,
                                                float scale) {
    for (int i = lane; i < d; i += 32) store_kv(dst + i, src[i], scale);
}

// One q or k head of qk_norm_rope_write_kv_body whose width d = 32 E is all rotated (2 half == d, E even), read
// and written V = E / 2 elements at a time: lane l holds elements V l .. V l + V - 1 of each half, so each rotated
// pair (i, i + d / 2) sits in one lane's registers. The caller checks that src, weight and the destinations are
// aligned to 2 V bytes. Each value is rounded where the general path rounds it (the sum of squares adds the
// lane's elements in another order).
template <int E, typename Put>
__device__ __forceinline__ void norm_rope_head(const bf16_t* __restrict__ src, const bf16_t* __restrict__ weight,
                                               float eps, const float* __restrict__ c, const float* __restrict__ s,
                                               int lane, Put put) {
    constexpr int V = E / 2, HALF = 16 * E;
    const int j = V * lane;
    float a[V], b[V], cs[V], ss[V];
    load_bf16<V>(src + j, a);
    load_bf16<V>(src + HALF + j, b);
    load_f32<V>(c + j, cs);
    load_f32<V>(s + j, ss);
    if (weight) {
        float wa[V], wb[V], sq = 0.0f;
        load_bf16<V>(weight + j, wa);
        load_bf16<V>(weight + HALF + j, wb);
#pragma unroll
        for (int m = 0; m < V; ++m) sq = __fmaf_rn(b[m], b[m], __fmaf_rn(a[m], a[m], sq));
        const float inv = 1.0f / sqrtf(__fadd_rn(__fdiv_rn(__shfl_sync(0xffffffffu, warp_sum(sq), 0), (float)(32 * E)), eps));
#pragma unroll
        for (int m = 0; m < V; ++m) {
            a[m] = bf16_to_float(float_to_bf16(__fmul_rn(__fmul_rn(a[m], inv), wa[m])));
            b[m] = bf16_to_float(float_to_bf16(__fmul_rn(__fmul_rn(b[m], inv), wb[m])));
        }
    }
    bf16_t lo[V], hi[V];
#pragma unroll
    for (int m = 0; m < V; ++m) {
        lo[m] = float_to_bf16(__fsub_rn(__fmul_rn(a[m], cs[m]), __fmul_rn(b[m], ss[m])));
        hi[m] = float_to_bf16(__fadd_rn(__fmul_rn(b[m], cs[m]), __fmul_rn(a[m], ss[m])));
    }
    put(j, lo);
    put(HALF + j, hi);
}

template <typename KV>
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
    for (int h = blockIdx.y * warps + warp; h < q_heads + 2 * kv_heads; h += gridDim.y * warps) {
        const bool is_q = h < q_heads, is_k = !is_q && h < q_heads + kv_heads;
        if (!is_q && slot < 0) continue;
        if (!is_q && !is_k) {
            const int vh = h - q_heads - kv_heads;
            copy_value_head(v_cache + slot * kv_row + (long long)vh * d, v + t * v_s0 + vh * v_s1, d, lane, v_scale);
            continue;
        }
        const bf16_t* src = is_q ? q + t * q_s0 + h * q_s1 : k + t * k_s0 + (h - q_heads) * k_s1;
        const bf16_t* weight = is_q ? q_weight : k_weight;
        bf16_t* q_dst = q_out + (t * q_heads + h) * d;
        KV* k_dst = k_cache + slot * kv_row + (long long)(h - q_heads) * d;
        const auto put = [&](int i, bf16_t x) {
            if (is_q)
                q_dst[i] = x;
            else
                store_kv(k_dst + i, x, k_scale);
        };
        const auto put_run = [&](int i, const auto& x) {
            if (is_q)
                store_bf16(q_dst + i, x);
            else
                store_kv_run(k_dst + i, x, k_scale);
        };
        // the common widths, fully rotated, with rows aligned to the runs of d / 64 elements: registers only
        const unsigned long long rows = (unsigned long long)src | (unsigned long long)weight |
                                        (is_q ? (unsigned long long)q_dst : (unsigned long long)k_dst);
        if (2 * half == d && (d == 64 || (d == 128 && (rows & 3) == 0) || (d == 256 && (rows & 7) == 0))) {
            if (d == 64)
                norm_rope_head<2>(src, weight, eps, c, s, lane, put_run);
            else if (d == 128)
                norm_rope_head<4>(src, weight, eps, c, s, lane, put_run);
            else
                norm_rope_head<8>(src, weight, eps, c, s, lane, put_run);
            continue;
        }
        // every global read of the head first (one memory round trip), then the arithmetic
        constexpr int PER_LANE = QKR_MAX_D / 32;
        float xs[PER_LANE], ws[PER_LANE], cs[PER_LANE / 2], ss[PER_LANE / 2];
#pragma unroll
        for (int m = 0; m < PER_LANE; ++m) {
            const int i = lane + 32 * m;
            xs[m] = i < d ? bf16_to_float(src[i]) : 0.0f;
            ws[m] = weight && i < d ? bf16_to_float(weight[i]) : 0.0f;
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
        const float inv = 1.0f / sqrtf(__fadd_rn(__fdiv_rn(__shfl_sync(0xffffffffu, warp_sum(sq), 0), (float)d), eps));
#pragma unroll
        for (int m = 0; m < PER_LANE; ++m) {
            const int i = lane + 32 * m;
            if (i < d)
                buf[i] = weight ? bf16_to_float(float_to_bf16(__fmul_rn(__fmul_rn(xs[m], inv), ws[m]))) : xs[m];
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
        for (int i = 2 * half + lane; i < d; i += 32) put(i, float_to_bf16(buf[i]));
        __syncwarp();
    }
}

// qk_norm_rope_write_kv_bf16 (the scales are ignored) and qk_norm_rope_write_kv_fp8.
#define QK_NORM_ROPE_WRITE_KV_KERNEL(NAME, KV)                                                                       \
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
        qk_norm_rope_write_kv_body(q, q_s0, q_s1, q_heads, k, k_s0, k_s1, v, v_s0, v_s1, kv_heads, q_weight,         \
                                   k_weight, eps, positions, cos_t, sin_t, half, q_out, k_cache, v_cache, slots, d,  \
                                   k_scale, v_scale);                                                                \
    }

QK_NORM_ROPE_WRITE_KV_KERNEL(qk_norm_rope_write_kv_bf16, bf16_t)
QK_NORM_ROPE_WRITE_KV_KERNEL(qk_norm_rope_write_kv_fp8, unsigned char)
