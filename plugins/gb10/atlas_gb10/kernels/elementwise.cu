// Row-wise and elementwise ops on bf16 activations: embedding, fused residual-add RMSNorm,
// SiLU/GELU-tanh gating, rotary embedding, paged KV write.
//
// Every kernel computes each row with a fixed thread layout that depends only on the row width,
// never on the number of rows, so a row's result is bitwise the same in any batch.
#include "common.cuh"

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

// x [rows, 2I] = [gate | up] (row stride ldx) -> out [rows, I] (row stride ldo).
extern "C" __global__ void silu_mul_bf16(const bf16_t* __restrict__ x, long long ldx, bf16_t* __restrict__ out,
                                         long long ldo, int inner, long long rows) {
    const long long n = rows * inner;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / inner;
        const int c = (int)(i - r * inner);
        const float g = bf16_to_float(x[r * ldx + c]);
        const float u = bf16_to_float(x[r * ldx + inner + c]);
        const float silu = g / (1.0f + expf(-g));  // g -> -inf: g / inf = -0, never NaN
        out[r * ldo + c] = float_to_bf16(silu * u);
    }
}

extern "C" __global__ void gelu_tanh_mul_bf16(const bf16_t* __restrict__ x, long long ldx, bf16_t* __restrict__ out,
                                              long long ldo, int inner, long long rows) {
    const long long n = rows * inner;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / inner;
        const int c = (int)(i - r * inner);
        const float g = bf16_to_float(x[r * ldx + c]);
        const float u = bf16_to_float(x[r * ldx + inner + c]);
        const float inner_arg = 0.7978845608028654f * (g + 0.044715f * g * g * g);
        out[r * ldo + c] = float_to_bf16(0.5f * g * (1.0f + tanhf(inner_arg)) * u);
    }
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

// Store k/v [T, Hk, D] (strided views) at flat slots of caches [blocks, block_size, Hk, D]; slot -1 skips.
extern "C" __global__ void write_kv_bf16(bf16_t* __restrict__ k_cache, bf16_t* __restrict__ v_cache,
                                         const bf16_t* __restrict__ k, long long k_s0, long long k_s1,
                                         const bf16_t* __restrict__ v, long long v_s0, long long v_s1,
                                         const int* __restrict__ slots, int kv_heads, int d) {
    const long long t = blockIdx.x;
    const long long slot = slots[t];
    if (slot < 0) return;
    const int total = kv_heads * d;
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
        const int h = i / d;
        const int j = i - h * d;
        k_cache[slot * total + i] = k[t * k_s0 + h * k_s1 + j];
        v_cache[slot * total + i] = v[t * v_s0 + h * v_s1 + j];
    }
}
