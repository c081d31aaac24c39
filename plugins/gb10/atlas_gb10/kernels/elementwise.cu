// Row-wise and elementwise ops on bf16 activations: embedding, fused residual-add RMSNorm,
// SiLU/GELU-tanh gating, rotary embedding, paged KV write (bf16 caches, or fp8 E4M3 caches with the layer's
// scales: `store_kv`), and those three fused for attention inputs.
//
// Every kernel computes each row with a fixed thread layout that depends only on the row width,
// never on the number of rows, so a row's result is bitwise the same in any batch.
#include "fp8.cuh"

// out[t, :] = weight[ids[t], :]; one block per token.
extern "C" __global__ void embedding_bf16(const bf16_t* __restrict__ weight, const int* __restrict__ ids,
                                          bf16_t* __restrict__ out, int hidden) {
    const long long t = blockIdx.x;
    const bf16_t* src = weight + (long long)ids[t] * hidden;
    bf16_t* dst = out + t * hidden;
    if ((hidden & 7) == 0) {
        const uint4* s = reinterpret_cast<const uint4*>(src);
        uint4* d = reinterpret_cast<uint4*>(dst);
        for (int i = threadIdx.x; i < hidden / 8; i += blockDim.x) d[i] = s[i];
    } else {
        for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = src[i];
    }
}

// Rows are addressed as (outer, inner) = (r / inner_count, r % inner_count) with element strides
// (s_outer, s_inner) for x and for the residual; the last axis is contiguous. This covers [T, H] and per-head [T, heads, D] views.
__device__ __forceinline__ long long row_offset(long long s_outer, long long s_inner, int inner_count, long long r) {
    return (r / inner_count) * s_outer + (r % inner_count) * s_inner;
}

// s = x (+ residual); normed = s / sqrt(mean(s^2) + eps) * weight; both outputs contiguous [rows, D].
// The residual stream output is rounded to bf16 first and the norm is taken of the rounded sum.
// One warp per row when D <= 1024 (blockDim 128 = 4 rows per block), else one 256-thread block per row.
__device__ __forceinline__ float rms_partial(const bf16_t* x, const bf16_t* res, int d, int lane, int stride) {
    float acc = 0.0f;
    for (int i = lane; i < d; i += stride) {
        float v = bf16_to_float(x[i]);
        if (res) v = bf16_to_float(float_to_bf16(__fadd_rn(v, bf16_to_float(res[i]))));
        acc = __fmaf_rn(v, v, acc);
    }
    return acc;
}

__device__ __forceinline__ void rms_write(const bf16_t* x, const bf16_t* res, const bf16_t* w, bf16_t* normed,
                                          bf16_t* summed, int d, int lane, int stride, float inv) {
    for (int i = lane; i < d; i += stride) {
        float v = bf16_to_float(x[i]);
        if (res) {
            bf16_t s = float_to_bf16(__fadd_rn(v, bf16_to_float(res[i])));
            summed[i] = s;
            v = bf16_to_float(s);
        } else if (summed) {
            summed[i] = x[i];
        }
        normed[i] = float_to_bf16(__fmul_rn(__fmul_rn(v, inv), bf16_to_float(w[i])));
    }
}

extern "C" __global__ void rms_norm_warp_bf16(const bf16_t* __restrict__ x, long long x_so, long long x_si,
                                              const bf16_t* __restrict__ res, long long r_so, long long r_si, int inner_count,
                                              const bf16_t* __restrict__ weight, bf16_t* __restrict__ normed,
                                              bf16_t* __restrict__ summed, float eps, int d, long long rows) {
    const long long r = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= rows) return;
    const int lane = threadIdx.x & 31;
    const bf16_t* xr = x + row_offset(x_so, x_si, inner_count, r);
    const bf16_t* rr = res ? res + row_offset(r_so, r_si, inner_count, r) : nullptr;
    float sq = warp_sum(rms_partial(xr, rr, d, lane, 32));
    sq = __shfl_sync(0xffffffffu, sq, 0);
    const float inv = 1.0f / sqrtf(__fadd_rn(__fdiv_rn(sq, (float)d), eps));
    rms_write(xr, rr, weight, normed + r * d, summed ? summed + r * d : nullptr, d, lane, 32, inv);
}

extern "C" __global__ void rms_norm_block_bf16(const bf16_t* __restrict__ x, long long x_so, long long x_si,
                                               const bf16_t* __restrict__ res, long long r_so, long long r_si, int inner_count,
                                               const bf16_t* __restrict__ weight, bf16_t* __restrict__ normed,
                                               bf16_t* __restrict__ summed, float eps, int d, long long rows) {
    __shared__ float partial[8];
    const long long r = blockIdx.x;
    const bf16_t* xr = x + row_offset(x_so, x_si, inner_count, r);
    const bf16_t* rr = res ? res + row_offset(r_so, r_si, inner_count, r) : nullptr;
    float sq = warp_sum(rms_partial(xr, rr, d, threadIdx.x, 256));
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32] = sq;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < 8; ++w) total = __fadd_rn(total, partial[w]);
    const float inv = 1.0f / sqrtf(__fadd_rn(__fdiv_rn(total, (float)d), eps));
    rms_write(xr, rr, weight, normed + r * d, summed ? summed + r * d : nullptr, d, threadIdx.x, 256, inv);
}

// Gated activations: x [rows, 2I] = [gate | up] (row stride ldx) -> out [rows, I] (row stride ldo),
// out = act(gate) * up with fp32 math.
struct Silu {
    __device__ float operator()(float g) const { return g / (1.0f + expf(-g)); }  // g -> -inf: g / inf = -0, never NaN
};

struct GeluTanh {
    __device__ float operator()(float g) const {
        return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
    }
};

template <typename Activation>
__device__ void gated_mul(const bf16_t* __restrict__ x, long long ldx, bf16_t* __restrict__ out, long long ldo, int inner,
                          long long rows, Activation act) {
    const long long n = rows * inner;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / inner;
        const int c = (int)(i - r * inner);
        const float g = bf16_to_float(x[r * ldx + c]);
        const float u = bf16_to_float(x[r * ldx + inner + c]);
        out[r * ldo + c] = float_to_bf16(act(g) * u);
    }
}

extern "C" __global__ void silu_mul_bf16(const bf16_t* __restrict__ x, long long ldx, bf16_t* __restrict__ out,
                                         long long ldo, int inner, long long rows) {
    gated_mul(x, ldx, out, ldo, inner, rows, Silu{});
}

extern "C" __global__ void gelu_tanh_mul_bf16(const bf16_t* __restrict__ x, long long ldx, bf16_t* __restrict__ out,
                                              long long ldo, int inner, long long rows) {
    gated_mul(x, ldx, out, ldo, inner, rows, GeluTanh{});
}

// Rotate-half RoPE in place on the first 2*half dims of every head of q [T, Hq, D] and k [T, Hk, D]
// (strided views: token stride s0, head stride s1, dims contiguous). cos/sin: [max_pos, half] fp32.
extern "C" __global__ void rope_bf16(bf16_t* __restrict__ q, long long q_s0, long long q_s1, int q_heads,
                                     bf16_t* __restrict__ k, long long k_s0, long long k_s1, int k_heads,
                                     const int* __restrict__ positions, const float* __restrict__ cos_t,
                                     const float* __restrict__ sin_t, int half) {
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
                                    float k_scale, float v_scale) {                                                 \
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
            const bf16_t* src = v + t * v_s0 + vh * v_s1;
            KV* dst = v_cache + slot * kv_row + (long long)vh * d;
            for (int i = lane; i < d; i += 32) store_kv(dst + i, src[i], v_scale);
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
        float sq = 0.0f;
        for (int i = lane; i < d; i += 32) {
            const float x = bf16_to_float(src[i]);
            buf[i] = x;
            sq = __fmaf_rn(x, x, sq);
        }
        if (weight) {
            sq = __shfl_sync(0xffffffffu, warp_sum(sq), 0);
            const float inv = 1.0f / sqrtf(__fadd_rn(__fdiv_rn(sq, (float)d), eps));
            for (int i = lane; i < d; i += 32)
                buf[i] = bf16_to_float(float_to_bf16(__fmul_rn(__fmul_rn(buf[i], inv), bf16_to_float(weight[i]))));
        }
        __syncwarp();
        for (int j = lane; j < half; j += 32) {
            const float a = buf[j], b = buf[j + half];
            put(j, float_to_bf16(__fsub_rn(__fmul_rn(a, c[j]), __fmul_rn(b, s[j]))));
            put(j + half, float_to_bf16(__fadd_rn(__fmul_rn(b, c[j]), __fmul_rn(a, s[j]))));
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
        qk_norm_rope_write_kv_body(q, q_s0, q_s1, q_heads, k, k_s0, k_s1, v, v_s0, v_s1, kv_heads, q_weight,         \
                                   k_weight, eps, positions, cos_t, sin_t, half, q_out, k_cache, v_cache, slots, d,  \
                                   k_scale, v_scale);                                                                \
    }

QK_NORM_ROPE_WRITE_KV_KERNEL(qk_norm_rope_write_kv_bf16, bf16_t)
QK_NORM_ROPE_WRITE_KV_KERNEL(qk_norm_rope_write_kv_fp8, unsigned char)

// Fill the fixed input buffers of a captured decode graph from one step's batch of `b` sequences,
// padding the bucket up to `size` (context 0, KV slot -1, state slot -1: pad rows read and write nothing).
// One block per row of the bucket; block tables are copied `width` entries per row (dst row stride W).
extern "C" __global__ void decode_inputs(const int* __restrict__ ids, const int* __restrict__ positions,
                                         const int* __restrict__ seq_lens, const int* __restrict__ slots,
                                         const int* __restrict__ state_slots, const int* __restrict__ tables, int width,
                                         int b, int* __restrict__ d_ids, int* __restrict__ d_positions,
                                         int* __restrict__ d_seq_lens, int* __restrict__ d_slots,
                                         int* __restrict__ d_state_slots, int* __restrict__ d_tables, int table_stride) {
    const int row = blockIdx.x;
    const bool real = row < b;
    if (threadIdx.x == 0) {
        d_ids[row] = real ? ids[row] : 0;
        d_positions[row] = real ? positions[row] : 0;
        d_seq_lens[row] = real ? seq_lens[row] : 0;
        d_slots[row] = real ? slots[row] : -1;
        d_state_slots[row] = real ? state_slots[row] : -1;
    }
    if (real)
        for (int i = threadIdx.x; i < width; i += blockDim.x)
            d_tables[(long long)row * table_stride + i] = tables[(long long)row * width + i];
}

// RMSNorm with 16-byte accesses: rows of D % 8 == 0 elements, 16-byte aligned. The row stays in
// registers between the sum of squares and the write (at most RMS_CHUNKS chunks of 8 per thread):
// a warp per row for D <= 32 * 8 * RMS_CHUNKS, a 256-thread block per row above that.
#define RMS_CHUNKS 4

template <int THREADS>
__device__ __forceinline__ void rms_norm_vec(const bf16_t* __restrict__ x, long long x_so, long long x_si,
                                             const bf16_t* __restrict__ res, long long r_so, long long r_si,
                                             int inner_count, const bf16_t* __restrict__ weight,
                                             bf16_t* __restrict__ normed, bf16_t* __restrict__ summed, float eps, int d,
                                             long long r, int t) {
    const uint4* xr = reinterpret_cast<const uint4*>(x + row_offset(x_so, x_si, inner_count, r));
    const uint4* rr = res ? reinterpret_cast<const uint4*>(res + row_offset(r_so, r_si, inner_count, r)) : nullptr;
    const int chunks = d / 8;
    float v[RMS_CHUNKS][8];
    float sq = 0.0f;
#pragma unroll
    for (int k = 0; k < RMS_CHUNKS; ++k) {
        const int ch = t + k * THREADS;
        if (ch < chunks) {
            const uint4 a = xr[ch];
            const unsigned aw[4] = {a.x, a.y, a.z, a.w};
            unsigned bw[4] = {0u, 0u, 0u, 0u};
            if (rr) {
                const uint4 b = rr[ch];
                bw[0] = b.x; bw[1] = b.y; bw[2] = b.z; bw[3] = b.w;
            }
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                float value = (e & 1) ? bf16_hi(aw[e / 2]) : bf16_lo(aw[e / 2]);
                if (rr) value = bf16_to_float(float_to_bf16(__fadd_rn(value, (e & 1) ? bf16_hi(bw[e / 2]) : bf16_lo(bw[e / 2]))));
                v[k][e] = value;
                sq = __fmaf_rn(value, value, sq);
            }
        }
    }
    sq = warp_sum(sq);
    if (THREADS > 32) {
        __shared__ float partial[THREADS / 32];
        if ((t & 31) == 0) partial[t / 32] = sq;
        __syncthreads();
        sq = 0.0f;
#pragma unroll
        for (int w = 0; w < THREADS / 32; ++w) sq = __fadd_rn(sq, partial[w]);
    } else {
        sq = __shfl_sync(0xffffffffu, sq, 0);
    }
    const float inv = 1.0f / sqrtf(__fadd_rn(__fdiv_rn(sq, (float)d), eps));
    const uint4* wr = reinterpret_cast<const uint4*>(weight);
    uint4* nr = reinterpret_cast<uint4*>(normed + r * d);
    uint4* sr = summed ? reinterpret_cast<uint4*>(summed + r * d) : nullptr;
#pragma unroll
    for (int k = 0; k < RMS_CHUNKS; ++k) {
        const int ch = t + k * THREADS;
        if (ch < chunks) {
            const uint4 wv = wr[ch];
            const unsigned ww[4] = {wv.x, wv.y, wv.z, wv.w};
            unsigned out[4], sum[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float n0 = __fmul_rn(__fmul_rn(v[k][2 * e], inv), bf16_lo(ww[e]));
                const float n1 = __fmul_rn(__fmul_rn(v[k][2 * e + 1], inv), bf16_hi(ww[e]));
                out[e] = (unsigned)float_to_bf16(n0) | ((unsigned)float_to_bf16(n1) << 16);
                sum[e] = (unsigned)float_to_bf16(v[k][2 * e]) | ((unsigned)float_to_bf16(v[k][2 * e + 1]) << 16);
            }
            const uint4 o = {out[0], out[1], out[2], out[3]};
            nr[ch] = o;
            if (sr) {
                const uint4 so = {sum[0], sum[1], sum[2], sum[3]};
                sr[ch] = so;
            }
        }
    }
}

extern "C" __global__ void rms_norm_warp_vec_bf16(const bf16_t* __restrict__ x, long long x_so, long long x_si,
                                                  const bf16_t* __restrict__ res, long long r_so, long long r_si,
                                                  int inner_count, const bf16_t* __restrict__ weight,
                                                  bf16_t* __restrict__ normed, bf16_t* __restrict__ summed, float eps,
                                                  int d, long long rows) {
    const long long r = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= rows) return;
    rms_norm_vec<32>(x, x_so, x_si, res, r_so, r_si, inner_count, weight, normed, summed, eps, d, r, threadIdx.x & 31);
}

extern "C" __global__ void rms_norm_block_vec_bf16(const bf16_t* __restrict__ x, long long x_so, long long x_si,
                                                   const bf16_t* __restrict__ res, long long r_so, long long r_si,
                                                   int inner_count, const bf16_t* __restrict__ weight,
                                                   bf16_t* __restrict__ normed, bf16_t* __restrict__ summed, float eps,
                                                   int d, long long rows) {
    rms_norm_vec<256>(x, x_so, x_si, res, r_so, r_si, inner_count, weight, normed, summed, eps, d, blockIdx.x, threadIdx.x);
}

// out[r, c] = x[r, c] * sigmoid(gate[r, gate_cols == 1 ? 0 : c]), fp32 math (Backend.sigmoid_gate).
extern "C" __global__ void sigmoid_gate_bf16(const bf16_t* __restrict__ x, long long ldx, const bf16_t* __restrict__ gate,
                                             long long ldg, int gate_cols, bf16_t* __restrict__ out, int cols,
                                             long long rows) {
    const long long total = rows * cols;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / cols;
        const int c = (int)(i - r * cols);
        const float g = bf16_to_float(gate[r * ldg + (gate_cols == 1 ? 0 : c)]);
        out[i] = float_to_bf16(bf16_to_float(x[r * ldx + c]) / (1.0f + expf(-g)));
    }
}

// The Gemma family's elementwise ops (its `gemma` op group): out[r, c] = op(x[r, c], y[r, c]) for rows of
// `cols` elements, x and y with their own row strides (one layer's slice of a stacked array included) and
// contiguous rows; out contiguous [rows, cols]; fp32 math. Unary ops ignore y (null).
struct SoftCap {
    float cap;
    __device__ float operator()(float x, float) const { return __fmul_rn(tanhf(__fdiv_rn(x, cap)), cap); }
};

struct Scale {
    float factor;
    __device__ float operator()(float x, float) const { return __fmul_rn(x, factor); }
};

struct AddScaled {
    float factor;
    __device__ float operator()(float x, float y) const { return __fmul_rn(__fadd_rn(x, y), factor); }
};

struct GeluTanhGate {
    __device__ float operator()(float gate, float up) const { return __fmul_rn(GeluTanh{}(gate), up); }
};

template <typename Op>
__device__ void map_rows(const bf16_t* __restrict__ x, long long ldx, const bf16_t* __restrict__ y, long long ldy,
                         bf16_t* __restrict__ out, int cols, long long rows, Op op) {
    const long long n = rows * cols;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / cols;
        const int c = (int)(i - r * cols);
        const float yv = y ? bf16_to_float(y[r * ldy + c]) : 0.0f;
        out[i] = float_to_bf16(op(bf16_to_float(x[r * ldx + c]), yv));
    }
}

#define MAP_KERNEL(NAME, OP)                                                                                         \
    extern "C" __global__ void NAME(const bf16_t* __restrict__ x, long long ldx, const bf16_t* __restrict__ y,       \
                                    long long ldy, bf16_t* __restrict__ out, int cols, long long rows, float value) { \
        map_rows(x, ldx, y, ldy, out, cols, rows, OP);                                                               \
    }

MAP_KERNEL(gemma_soft_cap_bf16, SoftCap{value})
MAP_KERNEL(gemma_scale_bf16, Scale{value})
MAP_KERNEL(gemma_add_scaled_bf16, AddScaled{value})
MAP_KERNEL(gemma_gelu_tanh_gate_bf16, GeluTanhGate{})

// The vision towers' ops (core's `vision` op group). GELU, exact (erf) or tanh-approximated, through
// map_rows; LayerNorm with bias: out[r, :] = (x - mean) / sqrt(var + eps) * weight + bias over rows of
// `cols` (x row stride ldx, out contiguous), fp32 math in two passes (the mean, then the centred
// variance), one 256-thread block per row.
struct GeluErf {
    __device__ float operator()(float x, float) const { return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f)); }
};

struct GeluTanhUnary {
    __device__ float operator()(float x, float) const { return GeluTanh{}(x); }
};

MAP_KERNEL(vision_gelu_erf_bf16, GeluErf{})
MAP_KERNEL(vision_gelu_tanh_bf16, GeluTanhUnary{})

#define LN_THREADS 256
__device__ __forceinline__ float block_sum(float v, float* partial) {
    v = warp_sum(v);
    __syncthreads();  // an earlier call's readers are done with `partial`
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < LN_THREADS / 32; ++w) total = __fadd_rn(total, partial[w]);
    return total;
}

extern "C" __global__ void __launch_bounds__(LN_THREADS) layer_norm_bf16(
    const bf16_t* __restrict__ x, long long ldx, const bf16_t* __restrict__ weight, const bf16_t* __restrict__ bias,
    bf16_t* __restrict__ out, int cols, float eps) {
    __shared__ float partial[LN_THREADS / 32];
    const bf16_t* row = x + (long long)blockIdx.x * ldx;
    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += LN_THREADS) sum = __fadd_rn(sum, bf16_to_float(row[c]));
    const float mean = __fdiv_rn(block_sum(sum, partial), (float)cols);
    float squares = 0.0f;
    for (int c = threadIdx.x; c < cols; c += LN_THREADS) {
        const float d = __fsub_rn(bf16_to_float(row[c]), mean);
        squares = __fmaf_rn(d, d, squares);
    }
    const float inv = rsqrtf(__fadd_rn(__fdiv_rn(block_sum(squares, partial), (float)cols), eps));
    bf16_t* dst = out + (long long)blockIdx.x * cols;
    for (int c = threadIdx.x; c < cols; c += LN_THREADS) {
        const float normed = __fmul_rn(__fsub_rn(bf16_to_float(row[c]), mean), inv);
        dst[c] = float_to_bf16(__fmaf_rn(normed, bf16_to_float(weight[c]), bf16_to_float(bias[c])));
    }
}

// The gemma group's clamp and pool_patches. clamp: out = x below `low` -> low, above `high` -> high (NaN stays),
// rows of `cols` with row stride ldx, out contiguous. pool_patches: out[o, c] = the mean of the kernel x kernel
// patches x[first[o] + i * width[o] + j, c] (i, j < kernel) of output o's block, summed in fp32 in (i, j) order;
// x [patches, C] with row stride ldx, out contiguous [outputs, C].
extern "C" __global__ void gemma_clamp_bf16(const bf16_t* __restrict__ x, long long ldx, bf16_t* __restrict__ out,
                                            int cols, long long rows, float low, float high) {
    const long long n = rows * cols;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / cols;
        const float v = bf16_to_float(x[r * ldx + (i - r * cols)]);
        out[i] = float_to_bf16(v < low ? low : (v > high ? high : v));
    }
}

extern "C" __global__ void gemma_pool_patches_bf16(const bf16_t* __restrict__ x, long long ldx,
                                                   const int* __restrict__ first, const int* __restrict__ width,
                                                   bf16_t* __restrict__ out, int channels, long long outputs, int kernel) {
    const long long n = outputs * channels;
    const float count = (float)(kernel * kernel);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long o = i / channels;
        const int c = (int)(i - o * channels);
        const long long base = first[o];
        const int w = width[o];
        float sum = 0.0f;
        for (int a = 0; a < kernel; ++a)
            for (int b = 0; b < kernel; ++b) sum = __fadd_rn(sum, bf16_to_float(x[(base + (long long)a * w + b) * ldx + c]));
        out[i] = float_to_bf16(__fdiv_rn(sum, count));
    }
}
